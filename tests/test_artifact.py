"""contract.artifact: artifact.json read in one step, each problem one line naming the file; the
geometry states each fact once."""

import json
import shutil

import pytest

from contract.artifact import ARTIFACT_FORMAT, ArtifactError, load_meta
from runtime.model.loader import load_artifact
from support.artifact_copies import resealed


@pytest.fixture
def copy(compiled, tmp_path):
    dst = tmp_path / "artifact"
    shutil.copytree(compiled("tiny-e2b", "b4"), dst)
    return dst


@pytest.fixture
def fp32_copy(compiled, tmp_path):
    dst = tmp_path / "fp32"
    shutil.copytree(compiled("tiny-e2b", "fp32"), dst)
    return dst


def test_the_geometry_states_kv_max_once_and_its_prefill(compiled):
    folder = compiled("tiny-e2b", "b4")
    geo = load_meta(folder).geometry
    assert geo.kv_max == geo.key_buckets[-1] == 64 and geo.prefill == "device"
    assert geo.kv_shapes == [(4, heads, geo.span(kind), dim) for (heads, dim), kind in zip(geo.kv_heads, geo.kv_kinds)]
    assert {geo.span(kind) for kind in geo.kv_kinds} == {geo.ring, 64}  # a sliding ring, a global kv_max
    stored = json.loads((folder / "artifact.json").read_text())["geometry"]
    assert "kv_max" not in stored and "kv_shapes" not in stored


def test_a_missing_or_broken_artifact_json_is_one_line(copy, tmp_path):
    with pytest.raises(ArtifactError, match="artifact.json is missing: .* is not an artifact made by"):
        load_meta(tmp_path / "nothing")
    (copy / "artifact.json").write_text("{")
    with pytest.raises(ArtifactError, match="artifact.json: not valid JSON"):
        load_meta(copy)


def test_another_format_or_a_bad_field_is_named(copy):
    resealed(copy, lambda raw: raw.update(format=ARTIFACT_FORMAT - 1))
    with pytest.raises(
        ArtifactError, match=f"artifact format {ARTIFACT_FORMAT - 1}, this runtime reads {ARTIFACT_FORMAT}"
    ):
        load_meta(copy)
    resealed(copy, lambda raw: raw.update(format=ARTIFACT_FORMAT) or raw["geometry"].update(prefill="gpu"))
    with pytest.raises(ArtifactError, match=r"artifact.json: geometry.prefill: "):
        load_meta(copy)


def test_an_edited_artifact_json_is_refused_by_name(fp32_copy):
    raw = json.loads((fp32_copy / "artifact.json").read_text())
    raw["geometry"]["rope"]["full"]["inv_freq"][1] *= 1.03
    (fp32_copy / "artifact.json").write_text(json.dumps(raw, indent=1))
    for load in (load_meta, load_artifact):  # verify's first step and the server's load path
        with pytest.raises(ArtifactError, match=r"artifact.json: digest mismatch \(edited or corrupted"):
            load(fp32_copy)


def test_a_corrupted_artifact_json_is_refused_by_name(fp32_copy):
    """One byte changed in a fact, and a file cut short. (A flip in a float's 17th digit that parses
    to the same double changes no fact, and the canonical digest rightly accepts it.)"""
    data = (fp32_copy / "artifact.json").read_bytes()
    at = data.index(b'"variant": "fp32"') + len(b'"variant": "fp3')
    (fp32_copy / "artifact.json").write_bytes(data[:at] + b"3" + data[at + 1 :])
    with pytest.raises(ArtifactError, match=r"artifact.json: digest mismatch"):
        load_artifact(fp32_copy)
    (fp32_copy / "artifact.json").write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match=r"artifact.json: not valid JSON"):
        load_artifact(fp32_copy)


def test_reformatting_artifact_json_keeps_it_valid(compiled, fp32_copy):
    """The digest covers the facts in a canonical form, not the whitespace or key order."""
    raw = json.loads((fp32_copy / "artifact.json").read_text())
    (fp32_copy / "artifact.json").write_text(json.dumps(dict(reversed(list(raw.items())))))
    assert load_meta(fp32_copy) == load_meta(compiled("tiny-e2b", "fp32"))
