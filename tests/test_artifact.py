"""contract.artifact: artifact.json read in one step, each problem one line naming the file; the
geometry states each fact once."""

import json
import re
import shutil

import pytest

from contract.artifact import ARTIFACT_FORMAT, ArtifactError, check_files, load_meta
from contract.tokenizer import TokenizerError, check_vocab, load_tokenizer
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


def _listed(folder, *rels):
    """Reseal artifact.json with these files listed (and hashed) too: an edit the digest cannot see."""
    from contract.artifact import sha256

    return resealed(folder, lambda raw: raw["files"].update({rel: sha256(folder / rel) for rel in rels}))


@pytest.mark.parametrize(
    "rel, text",
    [
        ("tokenizer/additional_chat_templates/default.jinja", "{{ 'replaced' }}"),  # would become the template
        ("tokenizer/added_tokens.json", '{"<extra>": 1024}'),  # an id one past the vocabulary
        ("graphs/notes.txt", "x"),
    ],
)
def test_a_file_artifact_json_does_not_list_is_refused_by_name(fp32_copy, rel, text):
    (fp32_copy / rel).parent.mkdir(parents=True, exist_ok=True)
    (fp32_copy / rel).write_text(text)
    assert check_files(fp32_copy, load_meta(fp32_copy)) == [
        f"{rel}: not listed in artifact.json (`build.py compile` did not write it; remove it)"
    ]
    with pytest.raises(ArtifactError, match=rf"{re.escape(rel)}: not listed in artifact.json"):
        load_artifact(fp32_copy)


def test_a_tokenizer_id_past_the_models_vocabulary_is_refused_at_load(fp32_copy):
    """Listed and hashed (artifact.json resealed), a token added past the vocabulary of 1024 still
    cannot reach the graphs: the loader checks the tokenizer's ids against the geometry."""
    (fp32_copy / "tokenizer" / "added_tokens.json").write_text('{"<extra>": 1024}')
    _listed(fp32_copy, "tokenizer/added_tokens.json")
    assert check_files(fp32_copy, load_meta(fp32_copy)) == []
    with pytest.raises(
        TokenizerError, match=r"token ids outside the model's vocabulary of 1024 \(0..1023\): '<extra>' = 1024"
    ):
        load_artifact(fp32_copy)


def test_the_vocabulary_check_counts_added_and_special_tokens(compiled):
    tok = load_tokenizer(compiled("tiny-e2b", "fp32") / "tokenizer")
    check_vocab(tok, 1024, "here")
    with pytest.raises(TokenizerError, match=r"vocabulary of 1000 \(0..999\): .* = 1000, .* = 1001, .* = 1002 \.\.\."):
        check_vocab(tok, 1000, "here")
    tok.add_special_tokens({"additional_special_tokens": ["<mine>"]})
    with pytest.raises(TokenizerError, match=r"'<mine>' = 1024"):
        check_vocab(tok, 1024, "here")


@pytest.mark.parametrize("rel", ["../outside/g6.pt", "/etc/passwd", "graphs/../../g.pt", "graphs//g.pt", "./g.pt"])
def test_a_path_outside_the_folder_is_refused(fp32_copy, rel):
    resealed(fp32_copy, lambda raw: raw["files"].update({rel: "0" * 64}))
    with pytest.raises(ArtifactError, match=rf"{re.escape(repr(rel))} is not a path inside the artifact folder"):
        load_meta(fp32_copy)


def test_a_graph_that_is_not_a_listed_file_is_refused(fp32_copy):
    resealed(fp32_copy, lambda raw: raw["graphs"].update(decode_64="../outside/g6.pt"))
    with pytest.raises(ArtifactError, match=r"graphs: \['../outside/g6.pt'\] not in the file list"):
        load_artifact(fp32_copy)


def test_eos_and_golden_ids_past_the_vocabulary_are_refused(fp32_copy):
    resealed(fp32_copy, lambda raw: raw.update(eos_token_ids=[1, 1024]))
    with pytest.raises(ArtifactError, match=r"token ids up to 1024 \(eos or golden\) on a vocabulary of 1024"):
        load_meta(fp32_copy)


def test_a_symlink_out_of_the_folder_is_refused_even_with_the_right_bytes(fp32_copy, tmp_path):
    outside = tmp_path / "outside-config.json"
    shutil.copy(fp32_copy / "config.json", outside)
    (fp32_copy / "config.json").unlink()
    (fp32_copy / "config.json").symlink_to(outside)
    (fp32_copy / "tokenizer" / "extra").symlink_to(tmp_path, target_is_directory=True)
    assert check_files(fp32_copy, load_meta(fp32_copy)) == [
        f"config.json: a symlink to {outside.resolve()}, outside the artifact folder",
        "tokenizer/extra: not listed in artifact.json (`build.py compile` did not write it; remove it)",
    ]
