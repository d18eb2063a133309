"""The Neuron path end to end on the CPU, against the SDK stand-in (tests/support/neuron_sdk):
`build.py compile --backend neuron`, `verify` and `serve` for every layout, and one test per
finding of the review against SDK 2.28's source, each failing if the finding comes back."""

import json
import re
from pathlib import Path

import openai
import pytest
import yaml

from contract.layout import ENCODER_MODEL, ENCODER_WEIGHTS, NXD_MODEL, NXD_WEIGHTS
from gemma4_port.bench.server import Server
from gemma4_port.source.manifest import load_manifest, shipped_manifests
from gemma4_port.source.manifest_yaml import ManifestError
from gemma4_port.source.toolchain import TOOLCHAIN
from support import MANIFESTS
from support.sdk import ROOT, STANDIN, run_cli, run_python, sdk_env

LAYOUTS = {  # the four ways a Neuron artifact runs; all through one ModelBuilder model
    "tp1": ("tiny-e2b", "fp32"),
    "batch4": ("tiny-e2b", "b4"),
    "tp2-device-prefill": ("tiny-e4b", "tp2"),
    "tp2-host-prefill": ("tiny-e4b", "tp2-host"),
    "tp2-speculative": ("tiny-e2b", "spec-tp2"),  # verify and drafter keys on the same KV state
    "media": ("tiny-e2b", "image-bf16"),  # the image and audio encoders: a model of their own
    "tp2-media": ("tiny-e2b", "media-tp2"),
}


@pytest.fixture(scope="module")
def neuron_artifact(tmp_path_factory):
    """neuron_artifact("tp1") -> (folder, the compile's stderr), compiled once by the CLI with the stand-in."""
    made = {}

    def get(layout: str):
        if layout not in made:
            name, variant = LAYOUTS[layout]
            out = tmp_path_factory.mktemp(layout) / "artifact"
            done = run_cli(
                "compile", MANIFESTS / f"{name}.yaml", "--variant", variant, "--backend", "neuron", "--out", out
            )
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
            made[layout] = out, done.stderr
        return made[layout]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_compiles_through_model_builder_and_verifies(neuron_artifact, layout):
    folder, _ = neuron_artifact(layout)
    meta = json.loads((folder / "artifact.json").read_text())
    host, media = layout == "tp2-host-prefill", layout.endswith("media")
    assert meta["backend"] == "neuron" and meta["graphs"]["model"] == NXD_MODEL
    # one model, all buckets (and one for the encoders)
    assert set(meta["graphs"]) == {"model"} | ({"host_prefill"} if host else set()) | ({"encoders"} if media else set())
    tp = meta["geometry"]["tp"]
    assert sorted(p for p in meta["files"] if p.startswith("weights/")) == [
        NXD_WEIGHTS.format(rank=r) for r in range(tp)
    ]  # one copy of each rank's weights, whatever the buckets
    assert {meta["versions"][p] for p in ("torch-neuronx", "neuronx-cc", "neuronx-distributed")} == {
        "2.8.0.2.12.22436",
        "2.23.6484.0",
        "0.17.26814",
    }
    if media:  # a model of their own: its graph file and rank 0's weights, none per other rank
        assert ENCODER_MODEL in meta["files"] and ENCODER_WEIGHTS.format(rank=0) in meta["files"]
        assert [p for p in meta["files"] if p.startswith("encoder_weights/")] == [ENCODER_WEIGHTS.format(rank=0)]
    done = run_cli("verify", folder, "--quick")
    assert done.returncode == 0 and re.search(r"\d+ passed, 0 failed", done.stdout), done.stdout + done.stderr
    if media:  # the rows that run the encoders, against Gemma4ForConditionalGeneration
        assert all(f"{row} " in done.stdout for row in ("image:one", "image:two", "audio:one", "audio:beside-image"))


FIRST_PROMPT = r"""
import torch
from runtime.model.loader import load_artifact
model = load_artifact(sys.argv[1])
backend = model.runner.backend
tokens, _ = model.runner.greedy([9, 10, 11, 12, 13], 6)
geo = model.meta.geometry
inputs = model.runner.host.prefill_inputs([9, 10, 11, 12, 13], geo.buckets[0], 0)
try:
    backend.model(*inputs)  # the call the backend made before: the traced executor's own forward
    old = "ran"
except RuntimeError as exc:
    old = str(exc).splitlines()[0]
from contract.graph_key import GraphKey
from contract.layout import signature
decode = len(signature(geo, GraphKey.decode(geo.kv_max)))
report({"tokens": tokens, "old_call": old, "inputs": len(inputs), "decode_inputs": decode})
"""


@pytest.mark.slow
def test_tp2_device_prefill_answers_its_first_prompt(neuron_artifact):
    """ModelBuilder traces its executor with the example of the key added last (decode);
    calling it with a prefill's inputs (more of them) failed every tp 2 device-prefill variant on its
    first prompt. The backend calls nxd_model.forward(list), which routes by the input shapes."""
    folder, _ = neuron_artifact("tp2-device-prefill")
    seen = run_python(FIRST_PROMPT, folder)
    assert len(seen["tokens"]) == 6
    n, d = seen["inputs"], seen["decode_inputs"]
    assert n != d and f"expected at most {d + 1} argument(s) but received {n + 1}" in seen["old_call"]


HOST_STATE = r"""
from runtime.model.loader import load_artifact
model = load_artifact(sys.argv[1])
backend, runner = model.runner.backend, model.runner
first = runner.greedy([9, 10, 11, 12, 13], 6)[0]
written = any(float(t.abs().sum()) > 0 for rank in backend.kv.ranks for t in rank)
before = backend.kv.ranks
backend.reset()
after = backend.kv.ranks
report({"written": written, "zero_after_reset": all(float(t.abs().sum()) == 0 for rank in after for t in rank),
        "new_tensors": all(a is not b for ra, rb in zip(before, after) for a, b in zip(ra, rb)),
        "same_again": runner.greedy([9, 10, 11, 12, 13], 6)[0] == first, "ranks": len(after)})
"""


@pytest.mark.slow
def test_host_prefill_writes_the_kv_into_the_state_the_decode_reads(neuron_artifact):
    """The host writes each rank's KV heads into the model's state; a reset builds new state, so
    the backend reads the live tensors each time (kept ones would be orphans no graph reads)."""
    folder, _ = neuron_artifact("tp2-host-prefill")
    seen = run_python(HOST_STATE, folder)
    assert seen == {"written": True, "zero_after_reset": True, "new_tensors": True, "same_again": True, "ranks": 2}


FORK = r"""
import torch
from runtime.model.loader import load_artifact
model = load_artifact(sys.argv[1])
runner, kv = model.runner, model.runner.backend.kv
ids = [9, 10, 11, 12, 13, 14, 15]
others = [slot for slot in range(model.meta.geometry.batch) if slot != 1]
want, want_logits = runner.greedy(ids, 6, slot=others[-1])
logits = runner.prefill_prompt(0, ids)
before = [[t.clone() for t in rank] for rank in kv.ranks]  # the stand-in's "device" tensors are on the CPU
trips = []
kv.read = lambda: trips.append("read")
kv.write = lambda values: trips.append("write")
runner.fork(0, 1)
after = kv.ranks
copied = [[bool(torch.equal(new[1, :, :len(ids)], old[0, :, :len(ids)])) and bool(torch.equal(new[others], old[others]))
           for new, old in zip(n, o)] for n, o in zip(after, before)]
runner.free(0)
got, close = [], []
for step in range(6):
    close.append(bool(torch.allclose(logits.float(), want_logits[step], atol=1e-4)))
    got.append(int(logits.argmax()))
    logits = runner.decode({1: got[-1]})[1]
report({"trips": trips, "copied": sorted({c for rank in copied for c in rank}), "tokens": got == want, "close": close})
"""


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["batch4", "tp2-host-prefill"])
def test_a_fork_runs_the_copy_key_and_the_kv_never_leaves_the_device(neuron_artifact, layout):
    """On a batch artifact a fork calls the model's copy key, a host-prefill one's too: the state is
    neither read to the host nor written from it, the target slot holds the source's prompt rows and
    the other slots are as they were; the forked slot then decodes as a prefill does."""
    folder, _ = neuron_artifact(layout)
    seen = run_python(FORK, folder)
    assert seen == {"trips": [], "copied": [True], "tokens": True, "close": [True] * 6}


@pytest.mark.slow
def test_serve_answers_on_the_stand_in(neuron_artifact, tmp_path):
    folder, _ = neuron_artifact("tp2-device-prefill")
    with Server(folder, tmp_path / "logs", ready_timeout_s=300, env=sdk_env()) as server:
        reply = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none").completions.create(
            model=server.model, prompt="hello world", max_tokens=4, temperature=0
        )
    assert reply.choices[0].text and reply.usage.completion_tokens == 4


@pytest.mark.slow
def test_serve_answers_an_image_and_a_clip_on_the_stand_in_at_tp2(neuron_artifact, tmp_path):
    """The server runs the encoder model (rank 0's core) beside the tp 2 decoder's: an image and a clip
    through the openai client are encoded once each (gemma4_encoder_seconds) and answered."""
    import base64
    import io
    import urllib.request
    import wave

    import numpy as np
    from PIL import Image

    folder, _ = neuron_artifact("tp2-media")
    image = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (45, 61, 3), dtype=np.uint8)).save(image, format="PNG")
    clip = io.BytesIO()
    with wave.open(clip, "wb") as w:  # 1 s of a 440 Hz tone at 16 kHz: 25 soft tokens
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes((np.sin(np.arange(16000) * 2 * np.pi * 440 / 16000) * 8000).astype("<i2").tobytes())
    url = "data:image/png;base64," + base64.b64encode(image.getvalue()).decode()
    audio = {"data": base64.b64encode(clip.getvalue()).decode(), "format": "wav"}
    content = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "input_audio", "input_audio": audio},
    ]
    with Server(folder, tmp_path / "logs", ready_timeout_s=300, env=sdk_env()) as server:
        reply = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none").chat.completions.create(
            model=server.model, messages=[{"role": "user", "content": content}], max_tokens=4, temperature=0
        )
        metrics = urllib.request.urlopen(f"{server.url}/metrics", timeout=30).read().decode()
    assert reply.usage.completion_tokens == 4 and reply.usage.prompt_tokens > 63 + 25
    counts = dict(re.findall(r'gemma4_encoder_seconds_count\{kind="(\w+)"\} (\S+)', metrics))
    assert {k: float(v) for k, v in counts.items()} == {"image": 1.0, "audio": 1.0}


# -- the sources and the pins ----------------------------------------------------------------------


def _sources():
    for package in ("gemma4_port", "runtime"):
        yield from (ROOT / package).rglob("*.py")


def test_no_parallel_model_trace_and_no_torch_neuronx_trace():
    """parallel_model_trace is unsupported from Neuron 2.27 and needs live process groups
    (it cannot compile in `docker build`); torch_neuronx.trace inlined a weight copy per graph."""
    uses = [
        f"{p.relative_to(ROOT)}: {call}"
        for p in _sources()
        for call in ("parallel_model_trace", "torch_neuronx.trace(")
        if call in p.read_text()
    ]
    assert uses == []
    assert not (STANDIN / "neuronx_distributed/trace/trace.py").exists()  # the stand-in has no such call to offer


# SDK 2.28.0 in aws-neuron-sdk src/helperscripts/n2-manifest.json
SDK_2_28 = {
    "torch_neuronx": "2.8.0.2.12.22436",
    "neuronx_cc": "2.23.6484.0",
    "neuronx_distributed": "0.17.26814",
    "neuron_runtime": "2.30.51.0",
    "neuron_collectives": "2.30.59.0",
    "neuron_tools": "2.28.23.0",
    "neuron_driver": "2.26.5.0",
}


@pytest.mark.parametrize("path", shipped_manifests(), ids=lambda p: p.stem)
def test_manifests_pin_sdk_2_28_exactly_and_compile_as_nxd_inference_does(path):
    """Exact builds of the release the manifest names; --auto-cast=none (what NxD
    Inference passes for bf16 weights; `all` downcast the float32 RMSNorm and softmax)."""
    tc = load_manifest(path).toolchain
    assert tc.neuron_sdk == "2.28" and {k: getattr(tc, k) for k in SDK_2_28} == SDK_2_28
    casts = [a for a in tc.compiler_args if a.startswith("--auto-cast")]
    assert casts == ["--auto-cast=none"]


def test_a_toolchain_with_a_release_prefix_is_refused(tmp_path):
    data = yaml.safe_load((MANIFESTS / "tiny-e2b.yaml").read_text())
    data["toolchain"] = yaml.safe_load(TOOLCHAIN.read_text()) | {"torch_neuronx": "2.8.0"}
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ManifestError, match="toolchain.torch_neuronx: String should match pattern"):
        load_manifest(tmp_path / "m.yaml")


def test_the_compile_asks_model_builder_for_no_other_auto_cast(neuron_artifact):
    """ModelBuilder warns ("--auto-cast=none not detected") on any other value."""
    _, stderr = neuron_artifact("tp1")
    assert "auto-cast=none`` not detected" not in stderr


# -- core placement ---------------------------------------------------------------------------------

PLACED = r"""
from runtime.model.loader import load_artifact
model = load_artifact(sys.argv[1])
report({"backend": list(model.runner.backend.cores), "model": list(model.runner.backend.model.nxd_model.cores)})
"""


@pytest.mark.slow
def test_a_server_given_core_1_runs_on_core_1(neuron_artifact):
    """Placement comes from NEURON_RT_VISIBLE_CORES (the device plugin's), not a hard-coded 0."""
    folder, _ = neuron_artifact("tp1")
    assert run_python(PLACED, folder, NEURON_RT_VISIBLE_CORES="1") == {"backend": [1], "model": [1]}


def test_hardware_tests_compile_each_variant_in_its_own_process():
    """ModelBuilder asks for a process per trace (it releases the runtime only at exit)."""
    text = (ROOT / "tests/test_neuron_hw.py").read_text()
    assert "compile_artifact(" not in text and '"compile"' in text


def test_stand_in_versions_are_sdk_2_28():
    code = (
        "import importlib.metadata as md\n"
        "report({p: md.version(p) for p in ('torch-neuronx', 'neuronx-cc', 'neuronx-distributed')})"
    )
    assert run_python(code) == {
        "torch-neuronx": SDK_2_28["torch_neuronx"],
        "neuronx-cc": SDK_2_28["neuronx_cc"],
        "neuronx-distributed": SDK_2_28["neuronx_distributed"],
    }


def test_golden_dockerfile_pins_every_wheel_and_apt_package():
    text = Path(ROOT / "tests/golden/images/gemma-4-e2b-neuron.base.Dockerfile").read_text()
    # The pins are build arguments (the manifest's values never become shell text), each used by its package.
    pins = {
        "NEURONX_CC": "2.23.6484.0",
        "TORCH_NEURONX": "2.8.0.2.12.22436",
        "NEURONX_DISTRIBUTED": "0.17.26814",
        "NEURON_RUNTIME": "2.30.51.0",
        "NEURON_COLLECTIVES": "2.30.59.0",
        "NEURON_TOOLS": "2.28.23.0",
    }
    assert all(f'{arg}="{version}"' in text for arg, version in pins.items())
    assert (
        '"neuronx-cc==${NEURONX_CC}" "torch-neuronx==${TORCH_NEURONX}" "neuronx-distributed==${NEURONX_DISTRIBUTED}"'
        in text
    )
    assert (
        'aws-neuronx-runtime-lib="${NEURON_RUNTIME}-*" aws-neuronx-collectives="${NEURON_COLLECTIVES}-*" '
        'aws-neuronx-tools="${NEURON_TOOLS}-*"' in text
    )
