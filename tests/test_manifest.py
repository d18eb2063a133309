import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from gemma4_port.source.manifest import load_manifest, shipped_manifests
from gemma4_port.source.manifest_yaml import ManifestError
from gemma4_port.source.toolchain import TOOLCHAIN, load_toolchain
from support import MANIFESTS, ROOT

SHIPPED = shipped_manifests()


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_manifests_parse(path):
    m = load_manifest(path)
    assert m.variants and m.toolchain.neuronx_cc


def test_real_manifests_use_the_seed_tp():
    tp = {
        n: {v.tp for v in load_manifest(MANIFESTS / f"{n}.yaml").variants}
        for n in ("gemma-4-e2b", "gemma-4-e4b", "gemma-4-12b")
    }
    assert 1 in tp["gemma-4-e2b"] and 2 in tp["gemma-4-e4b"] and tp["gemma-4-12b"] == {2}


def _write(tmp_path, data) -> Path:
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _base():
    return yaml.safe_load((MANIFESTS / "tiny-e2b.yaml").read_text())


def _shared(drop: str | None = None) -> dict:
    """The shared toolchain file as a manifest's own `toolchain:` block, less one field."""
    return {k: v for k, v in yaml.safe_load(TOOLCHAIN.read_text()).items() if k != drop}


@pytest.mark.parametrize(
    "mutate, field, words",
    [
        (lambda d: d["variants"][0].update(tp=3), "variants[0].tp", "1 or 2"),
        (lambda d: d["variants"][0].update(dtype="float16"), "variants[0].dtype", "float32"),
        (lambda d: d["variants"][0].update(buckets=[32, 16]), "variants[0]", "increasing"),
        (lambda d: d["variants"][0].update(buckets=[16, 64]), "variants[0]", "kv_max"),
        (lambda d: d["variants"][1].update(name="fp32"), "(top level)", "unique"),
        (lambda d: d.pop("name"), "name", "required"),
        (lambda d: d["model"].update(source="google/gemma-4-E2B-it"), "model", "exactly one"),
        (
            lambda d: d["model"]["random"]["config"].update(num_hidden_layers="many"),
            "model.random.config",
            "Gemma4TextConfig",
        ),
        (lambda d: d.update(toolchain=_shared(drop="neuronx_cc")), "toolchain.neuronx_cc", "required"),
        (lambda d: d.update(surprise=1), "surprise", "unknown field; allowed here: name, model, toolchain"),
        # A misspelled key: the unknown field first, not the "Field required" it leaves behind.
        (lambda d: d.update(toolchian=_shared()), "toolchian", "unknown field"),
        (
            lambda d: d["variants"][0].update(tpp=d["variants"][0].pop("tp")),
            "variants[0].tpp",
            "unknown field; allowed here: name, tp, batch",
        ),
    ],
)
def test_bad_manifest_names_file_and_field(tmp_path, mutate, field, words):
    data = _base()
    mutate(data)
    with pytest.raises(ManifestError) as err:
        load_manifest(_write(tmp_path, data))
    msg = str(err.value)
    assert msg.startswith(f"{tmp_path / 'bad.yaml'}: {field}:"), msg
    assert words.lower() in msg.lower()
    assert "\n" not in msg


def test_unknown_variant_lists_the_choices():
    m = load_manifest(MANIFESTS / "tiny-e2b.yaml")
    with pytest.raises(ManifestError, match=r"no variant 'nope'; choose one of \['fp32', 'bf16'"):
        m.variant("nope")


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ManifestError, match="no such manifest"):
        load_manifest(tmp_path / "absent.yaml")
    (tmp_path / "x.yaml").write_text("name: [unclosed")
    with pytest.raises(ManifestError, match="not valid YAML"):
        load_manifest(tmp_path / "x.yaml")


@pytest.mark.parametrize(
    "text, where",
    [
        ("name: [unclosed", "line 1, column 16: expected ',' or ']'"),
        ("name: x\nmodel: {source: a\n  b: [\n", "line 3, column 4: expected ',' or '}', but got ':'"),
    ],
)
def test_a_yaml_syntax_error_is_one_line_naming_the_file_and_line(tmp_path, text, where):
    (tmp_path / "x.yaml").write_text(text)
    with pytest.raises(ManifestError) as err:
        load_manifest(tmp_path / "x.yaml")
    msg = str(err.value)
    assert msg.startswith(f"{tmp_path / 'x.yaml'}: not valid YAML: {where}"), msg
    assert "\n" not in msg and "<unicode string>" not in msg


def test_a_directory_is_one_error_line(tmp_path):
    run = subprocess.run(
        [sys.executable, "build.py", "plan", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 2 and run.stderr == f"error: {tmp_path} is a directory; give the file itself\n"


def test_manifests_are_frozen():
    m = load_manifest(MANIFESTS / "tiny-e2b.yaml")
    with pytest.raises(ValidationError, match="tp\n  Instance is frozen"):
        m.variants[0].tp = 2
    assert m.variants[0].tp == 1


@pytest.mark.parametrize(
    "model, field, allowed",
    [
        ({"revision": "main$(id>PWNED)"}, "model.revision", "a branch or tag name"),
        ({"revision": "main`id`"}, "model.revision", "a branch or tag name"),
        ({"revision": "v1;id"}, "model.revision", "or a commit sha"),
        ({"revision": "a..b"}, "model.revision", "git's ref rules"),
        ({"revision": "x.lock"}, "model.revision", "git's ref rules"),
        ({"revision": "-x"}, "model.revision", "git's ref rules"),
        ({"revision": "main\nRUN id"}, "model.revision", "git's ref rules"),
        ({"source": "google/gemma$(id>PWNED)"}, "model.source", "a hub repo id (owner/name"),
        ({"source": 'g/x" && id #'}, "model.source", "or a local folder starting with /"),
        ({"source": "a/b/c"}, "model.source", "a hub repo id"),
        ({"source": "/ckpt\nRUN id"}, "model.source", "a local folder"),
    ],
)
def test_a_revision_or_source_that_could_reach_a_shell_is_refused_by_name(tmp_path, model, field, allowed):
    data = _base()
    source = model.pop("source", "google/gemma-4-E2B-it")
    data["model"] = {"source": source, **model}
    with pytest.raises(ManifestError) as err:
        load_manifest(_write(tmp_path, data))
    msg = str(err.value)
    assert msg.startswith(f"{tmp_path / 'bad.yaml'}: {field}: "), msg
    assert allowed in msg and "\n" not in msg


@pytest.mark.parametrize(
    "model",
    [
        {"source": "google/gemma-4-E2B-it", "revision": "main"},
        {"source": "google/gemma-4-E2B-it", "revision": "refs/pr/12"},
        {"source": "google/gemma-4-E2B-it", "revision": "release/v1.2_rc-3"},
        {"source": "google/gemma-4-E2B-it", "revision": "0123456789abcdef0123456789abcdef01234567"},
        {"source": "/data/checkpoints/gemma 4"},
        {"source": "./ckpt"},
        {"source": "~/models/gemma"},
    ],
)
def test_hub_ids_git_refs_and_local_folders_are_accepted(tmp_path, model):
    data = _base()
    data["model"] = model
    m = load_manifest(_write(tmp_path, data))
    assert (m.model.source, m.model.revision) == (model["source"], model.get("revision"))


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d["images"].update(repository="x\nRUN id"), "images.repository"),
        (lambda d: d["images"].update(repository="Upper/case"), "images.repository"),
        (lambda d: d["images"].update(repository="registry.example:5000/a/b"), None),
        (lambda d: d["images"].update(repository="localhost/a"), None),
        (lambda d: d["images"]["tags"].update(slim="a b"), "images.tags.slim"),
        (lambda d: d.update(toolchain=_shared() | {"transformers": '5.24.0" $(id) "'}), "toolchain.transformers"),
    ],
)
def test_image_names_tags_and_pins_follow_their_grammar(tmp_path, mutate, field):
    data = _base()
    mutate(data)
    if field is None:  # allowed
        load_manifest(_write(tmp_path, data))
        return
    with pytest.raises(ManifestError, match=rf"^{re.escape(str(tmp_path / 'bad.yaml'))}: {field}: String should match"):
        load_manifest(_write(tmp_path, data))


def test_key_buckets_default_to_kv_max_and_must_end_there(tmp_path):
    data = _base()
    data["variants"][0].pop("key_buckets", None)
    data["variants"][1]["key_buckets"] = []
    m = load_manifest(_write(tmp_path, data))
    assert [v.key_buckets for v in m.variants[:2]] == [(v.kv_max,) for v in m.variants[:2]]
    data["variants"][0].update(kv_max=64, key_buckets=[32, 48])
    with pytest.raises(
        ManifestError, match=r"variants\[0\]: .*key_buckets must .* end at kv_max \(64\), got \[32, 48\]"
    ):
        load_manifest(_write(tmp_path, data))


def test_every_shipped_manifest_builds_with_the_one_shared_toolchain():
    shared = load_toolchain()
    assert SHIPPED and TOOLCHAIN not in SHIPPED
    for path in SHIPPED:
        assert "toolchain" not in yaml.safe_load(path.read_text()), path.name
        assert load_manifest(path).toolchain == shared, path.name


def test_a_manifests_own_toolchain_overrides_the_shared_one_and_is_validated_the_same(tmp_path):
    data = _base()
    data["toolchain"] = _shared() | {"neuronx_cc": "2.23.9999.0"}
    assert load_manifest(_write(tmp_path, data)).toolchain.neuronx_cc == "2.23.9999.0"
    data["toolchain"]["neuronx_cc"] = "2.23"
    with pytest.raises(ManifestError, match=r"bad.yaml: toolchain.neuronx_cc: String should match pattern"):
        load_manifest(_write(tmp_path, data))


def test_a_broken_shared_toolchain_names_its_own_file(tmp_path):
    bad = tmp_path / "toolchain.yaml"
    bad.write_text(yaml.safe_dump(_shared(drop="neuron_driver")))
    with pytest.raises(ManifestError, match=f"^{bad}: neuron_driver: Field required$"):
        load_toolchain(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ManifestError, match="expected a mapping at the top level, got list"):
        load_toolchain(bad)


DIGEST = "sha256:" + "0" * 64


@pytest.mark.parametrize(
    "speculative, error",
    [
        ({"k": 3, "drafter": "../drafter", "digest": DIGEST}, None),
        ({"k": 3, "drafter": "google/gemma-4-E2B-it-assistant", "digest": DIGEST}, "a local drafter folder"),
        ({"k": 3, "digest": DIGEST}, "a local drafter folder"),
        ({"k": 3, "drafter": "./drafter", "digest": "sha256:abc"}, "sha256:[0-9a-f]{64}"),
    ],
)
def test_the_drafter_digest_pins_a_local_folder_only(tmp_path, speculative, error):
    data = _base()
    data["speculative"] = speculative
    if error is None:
        assert load_manifest(_write(tmp_path, data)).speculative.digest == DIGEST
        return
    with pytest.raises(ManifestError, match="speculative") as err:
        load_manifest(_write(tmp_path, data))
    assert error in str(err.value)
