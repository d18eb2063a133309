"""`build.py verify`: compile then verify, and one test per way an artifact can be silently wrong."""

import json
import shutil
from pathlib import Path

import pytest

from contract.artifact import load_meta, sha256, write_raw
from gemma4_port.compile.backends import compile_artifact
from gemma4_port.compile.tracing import CompileError
from gemma4_port.port.decoder import Gemma4Decoder
from gemma4_port.source.manifest import load_manifest, parse_manifest
from support import MANIFESTS
from support.cli import verify


def _reseal(folder: Path, rel: str) -> None:
    """Record a file's new sha256, so a test can reach the check behind the sha256 check."""
    meta = json.loads((folder / "artifact.json").read_text())
    meta.pop("digest")
    meta["files"][rel] = sha256(folder / rel)
    write_raw(folder, meta)


@pytest.mark.parametrize("name", ["tiny-e2b", "tiny-e4b", "tiny-12b"])
@pytest.mark.parametrize("variant", ["fp32", "bf16"])
def test_compile_then_verify_matches_the_float_reference(compiled, name, variant):
    result = verify(compiled(name, variant))
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("│")]
    for case in (
        "golden:chat",
        "random:bucket-16",
        "random:bucket-32",
        "random:cross-window",
        "random:to-kv_max",
        "random:1.5x-bucket",
        "random:kv_max-8",
        "turns:reuse-prefix",
    ):
        assert any(case in row for row in rows), case
    assert "0 failed" in result.stdout
    if variant == "fp32":
        assert "near-tie" not in result.stdout


def test_batch_slots_decode_together_and_match(compiled):
    result = verify(compiled("tiny-e2b", "b4"), "--quick")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("slots:") == 4
    # a fork per copy graph (key buckets 32, 64): a 10-token and a 48-token prompt continued in the slot
    # that copied them, each as the reference says
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.startswith("│")}
    forks = {name: row.split("│")[2].strip() for name, row in rows.items() if name.startswith("fork:")}
    assert forks == {"fork:golden:capital": "10", "fork:random:1.5x-bucket": "48"}
    assert all("│ True " in rows[name] for name in forks)


@pytest.mark.parametrize("name, variant", [("tiny-e2b", "chunks"), ("tiny-12b", "chunks-tp2")])
def test_long_prompts_reuse_and_chunk_stages_match(compiled, name, variant):
    """Buckets of 8 and 16 in a context of 128 (tp 1) or 64 (tp 2): prompts of 1.5x, 3x and kv_max - 8
    tokens (through the window and the sliding ring, and across the key buckets: their chunks change
    key bucket), a second turn that prefills only past the first turn's KV, and two slots prefilling
    a chunk per step beside a decoding one."""
    folder = compiled(name, variant)
    kv_max = load_meta(folder).geometry.kv_max
    result = verify(folder)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.startswith("│")}
    # key buckets 16, 64 (and 128 at tp 1): 19 and 67 tokens end a chunk at 16 (64), the next runs over 64 (128)
    for case, length in (
        ("random:1.5x-bucket", 24),
        ("random:3x-bucket", 48),
        ("random:kv_max-8", kv_max - 8),
        ("stages:random:kv_max-8", kv_max - 8),
        ("stages:random:short", 3),
        ("random:keys-16+3", 19),
        *((("random:keys-64+3", 67),) if kv_max == 128 else ()),
    ):
        assert rows[case].split("│")[2].strip() == str(length) and "│ True " in rows[case], case
    turn = rows["turns:reuse-prefix"].split("│")[2].strip()  # "37 (31 reused)": the first turn and its reply
    assert turn.endswith("reused)") and int(turn.split("(")[1].split()[0]) > 16, turn
    assert "│ True " in rows["turns:reuse-prefix"] and "0 failed" in result.stdout


def test_any_random_config_works(tmp_path):
    """Not just the three shipped shapes: no PLE, GQA 6:2, k_eq_v off, window 4, only 4 layers."""
    data = {
        "name": "odd",
        "toolchain": load_manifest(MANIFESTS / "tiny-e2b.yaml").toolchain.model_dump(),
        "model": {
            "random": {
                "seed": 5,
                "config": {
                    "vocab_size": 512,
                    "hidden_size": 48,
                    "intermediate_size": 96,
                    "num_hidden_layers": 4,
                    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                    "num_attention_heads": 6,
                    "num_key_value_heads": 2,
                    "head_dim": 8,
                    "global_head_dim": 16,
                    "sliding_window": 4,
                    "hidden_size_per_layer_input": 0,
                    "final_logit_softcapping": 30.0,
                },
            }
        },
        "variants": [{"name": "v", "buckets": [6, 16], "kv_max": 24, "dtype": "float32"}],
    }
    manifest = parse_manifest(data, "inline")
    out = compile_artifact(manifest, manifest.variants[0], tmp_path / "a")
    result = verify(out)
    assert result.returncode == 0, result.stdout + result.stderr


def test_layer_scalar_left_at_one_fails_verify(tmp_path, monkeypatch):
    """A costly bug: a loader that copies parameters only leaves the buffer at 1.0."""
    original = Gemma4Decoder.load_weights

    def params_only(self, reader):
        original(self, reader)
        for layer in self.layers:
            layer.layer_scalar.fill_(1.0)

    monkeypatch.setattr(Gemma4Decoder, "load_weights", params_only)
    manifest = load_manifest(MANIFESTS / "tiny-e2b.yaml")
    with pytest.raises(CompileError, match="disagree with the float reference"):
        compile_artifact(manifest, manifest.variant("fp32"), tmp_path / "a")  # compile's own check catches it
    # An artifact made without that check (elsewhere, or by an older build) is caught by verify.
    monkeypatch.setattr("gemma4_port.compile.pipeline.self_test_here", lambda folder: None)
    out = compile_artifact(manifest, manifest.variant("fp32"), tmp_path / "b")
    result = verify(out, "--quick")
    assert result.returncode == 1, result.stdout + result.stderr
    passed, failed = (int(part.split()[0]) for part in result.stdout.strip().splitlines()[-1].split(","))
    assert failed >= 5 * passed, (passed, failed)  # nearly every prompt goes wrong, not just an unlucky one


@pytest.fixture
def artifact_copy(compiled, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(compiled("tiny-e2b", "fp32"), dst)
    return dst


@pytest.mark.parametrize("rel", ["host/tables.safetensors", "graphs/graphs.pt", "tokenizer/tokenizer.json"])
def test_a_corrupted_file_fails_verify_naming_it(artifact_copy, rel):
    path = artifact_copy / rel
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    result = verify(artifact_copy)
    assert result.returncode != 0
    assert f"{rel}: sha256 mismatch" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_missing_tokenizer_json_is_a_clear_error(artifact_copy):
    (artifact_copy / "tokenizer/tokenizer.json").unlink()
    result = verify(artifact_copy)
    assert result.returncode == 2 and "tokenizer/tokenizer.json: missing" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_truncated_tokenizer_json_is_a_clear_error(artifact_copy):
    path = artifact_copy / "tokenizer/tokenizer.json"
    path.write_text(path.read_text()[:5000])
    _reseal(artifact_copy, "tokenizer/tokenizer.json")
    result = verify(artifact_copy)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "tokenizer.json cannot be loaded" in result.stderr and "Traceback" not in result.stderr


def test_a_tokenizer_that_collapses_hello_world_is_refused(artifact_copy):
    """An impostor: a tokenizer with no vocabulary maps every prompt to <unk>."""
    from tokenizers import Tokenizer, models

    empty = Tokenizer(models.WordLevel(vocab={"<unk>": 0}, unk_token="<unk>"))
    empty.save(str(artifact_copy / "tokenizer/tokenizer.json"))
    _reseal(artifact_copy, "tokenizer/tokenizer.json")
    result = verify(artifact_copy)
    assert result.returncode == 2 and "maps 'hello world' to" in result.stderr


@pytest.mark.parametrize("name, variant", [("tiny-e2b", "image-bf16"), ("tiny-12b", "image-tp2")])
def test_images_match_the_multimodal_reference(compiled, name, variant):
    """Image prompts (one, two, across the largest bucket's chunk boundary, deep in a prompt of several
    chunks, a second turn with the same image and with other bytes) against
    Gemma4ForConditionalGeneration given the processor's pixel_values: E2B-shaped in bf16 (with audio
    clips, given input_features), and the 12B-shaped model (an image sees itself both ways on sliding
    layers) at tp 2, batch 2."""
    result = verify(compiled(name, variant), "--quick")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.startswith("│")}
    cases = ["image:one", "image:two", "image:across-chunk", "image:many-chunks", "image:reuse-same"]
    cases += ["image:other-bytes"] + (["audio:one", "audio:beside-image"] if name == "tiny-e2b" else [])
    for case in cases:  # bf16 may meet a near-tie of the reference's, within its bound
        assert rows[case].split("│")[4].strip() in ("True", "near-tie"), rows.get(case, case)
    # bos, 4 words, boi: the other image's bytes end the kept prefix at its first soft token; the same
    # image is kept whole (its soft tokens, eoi and the words after it)
    assert rows["image:other-bytes"].split("│")[2].strip().endswith("(6 reused)")
    kept = int(rows["image:reuse-same"].split("│")[2].split("(")[1].split()[0])
    assert kept > 6 + load_meta(compiled(name, variant)).geometry.vision.max_soft_tokens // 2
    assert "0 failed" in result.stdout


def test_the_12b_reference_sees_an_image_both_ways(compiled):
    """The rows above test the bidirectional rule: transformers' 12B-shaped model gives other logits for
    an image prompt without mm_token_type_ids (causal only), by far more than the float32 bound."""
    import torch

    from contract.tokenizer import load_tokenizer
    from gemma4_port.verify.media_cases import MediaPrompts
    from gemma4_port.verify.reference import load_reference, media_inputs

    folder = compiled("tiny-12b", "image-tp2")
    meta = load_meta(folder)
    case = MediaPrompts(folder, meta, load_tokenizer(folder / "tokenizer")).cases()[0]  # image:one
    reference = load_reference(Path(meta.checkpoint))
    ids = case.ids
    inputs = media_inputs(reference, ids, [m.features for m in case.media])  # images only
    with torch.no_grad():
        both = reference(input_ids=torch.tensor([ids]), **inputs).logits[0, -1]
        inputs.pop("mm_token_type_ids")
        causal = reference(input_ids=torch.tensor([ids]), **inputs).logits[0, -1]
    assert float((both - causal).abs().max()) > 1e-2
