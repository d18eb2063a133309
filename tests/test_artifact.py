"""contract.artifact: artifact.json read in one step, each problem one line naming the file; the
geometry states each fact once."""

import json
import shutil

import pytest

from contract.artifact import ARTIFACT_FORMAT, ArtifactError, load_meta, write_raw
from runtime.model.loader import load_artifact


@pytest.fixture
def copy(compiled, tmp_path):
    dst = tmp_path / "artifact"
    shutil.copytree(compiled("tiny-e2b", "b4"), dst)
    return dst


def _edit(folder, edit):
    """Edit and reseal (a fresh digest), so the edit reaches the checks behind the digest's."""
    raw = json.loads((folder / "artifact.json").read_text())
    raw.pop("digest")
    edit(raw)
    write_raw(folder, raw)


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
    _edit(copy, lambda raw: raw.update(format=ARTIFACT_FORMAT - 1))
    with pytest.raises(ArtifactError, match=f"artifact format {ARTIFACT_FORMAT - 1}, this runtime reads {ARTIFACT_FORMAT}"):
        load_meta(copy)
    _edit(copy, lambda raw: raw.update(format=ARTIFACT_FORMAT) or raw["geometry"].update(prefill="gpu"))
    with pytest.raises(ArtifactError, match=r"artifact.json: geometry.prefill: "):
        load_meta(copy)


def test_an_edited_artifact_json_is_refused_by_name(compiled, tmp_path):
    folder = tmp_path / "edited"
    shutil.copytree(compiled("tiny-e2b", "fp32"), folder)
    raw = json.loads((folder / "artifact.json").read_text())
    raw["geometry"]["rope"]["full"]["inv_freq"][1] *= 1.03
    (folder / "artifact.json").write_text(json.dumps(raw, indent=1))
    for load in (load_meta, load_artifact):  # verify's first step and the server's load path
        with pytest.raises(ArtifactError, match=r"artifact.json: digest mismatch \(edited or corrupted"):
            load(folder)


def test_a_corrupted_artifact_json_is_refused_by_name(compiled, tmp_path):
    """One byte changed in a fact, and a file cut short. (A flip in a float's 17th digit that parses
    to the same double changes no fact, and the canonical digest rightly accepts it.)"""
    folder = tmp_path / "corrupted"
    shutil.copytree(compiled("tiny-e2b", "fp32"), folder)
    data = (folder / "artifact.json").read_bytes()
    at = data.index(b'"variant": "fp32"') + len(b'"variant": "fp3')
    (folder / "artifact.json").write_bytes(data[:at] + b"3" + data[at + 1:])
    with pytest.raises(ArtifactError, match=r"artifact.json: digest mismatch"):
        load_artifact(folder)
    (folder / "artifact.json").write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match=r"artifact.json: not valid JSON"):
        load_artifact(folder)


def test_reformatting_artifact_json_keeps_it_valid(compiled, tmp_path):
    """The digest covers the facts in a canonical form, not the whitespace or key order."""
    folder = tmp_path / "reformatted"
    shutil.copytree(compiled("tiny-e2b", "fp32"), folder)
    raw = json.loads((folder / "artifact.json").read_text())
    (folder / "artifact.json").write_text(json.dumps(dict(reversed(list(raw.items())))))
    assert load_meta(folder) == load_meta(compiled("tiny-e2b", "fp32"))
