"""The shipped tiny-chat pair (build.py train-tiny's output, not retrained here): the files are what
the manifest pins, the target answers held-out questions in words, its drafter is accepted, speculation
changes no token, and the training's parallel draft rounds are the drafter's own forward."""

import shutil

import pytest
import torch
import yaml

from gemma4_port.bench import speculative
from gemma4_port.compile.pipeline import recorded_manifest, start_build
from gemma4_port.source import tiny_corpus, train_drafter
from gemma4_port.source.checkpoint import folder_digest, resolve_checkpoint, resolve_drafter
from gemma4_port.source.checkpoint_files import CheckpointError
from gemma4_port.source.manifest import Manifest, find_manifest, load_manifest
from gemma4_port.source.train_tiny import SHIPPED, TinyChatSpec

K = 3


@pytest.fixture(scope="module")
def pair():
    from contract.tokenizer import load_tokenizer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: a thread pool only stalls on a busy host
    target, drafter = speculative.load_pair(SHIPPED, K)
    yield target, drafter, load_tokenizer(SHIPPED / "target")
    torch.set_num_threads(threads)


def test_the_manifest_pins_the_shipped_folder_by_digest():
    manifest = load_manifest(find_manifest("tiny-chat"))
    assert resolve_checkpoint(manifest) == (SHIPPED / "target").resolve()
    assert folder_digest(SHIPPED / "target") == manifest.model.digest
    total = sum(p.stat().st_size for p in SHIPPED.rglob("*") if p.is_file())
    assert total < 6 * 2**20  # a few MB in the repository


def test_a_changed_checkpoint_file_is_refused(tmp_path):
    folder = tmp_path / "target"
    shutil.copytree(SHIPPED / "target", folder)
    data = yaml.safe_load(find_manifest("tiny-chat").read_text())
    data["model"]["source"] = str(folder)
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(data))
    manifest = load_manifest(tmp_path / "m.yaml")
    assert resolve_checkpoint(manifest) == folder.resolve()
    (folder / "generation_config.json").write_text("{}\n")
    with pytest.raises(CheckpointError, match="digest"):
        resolve_checkpoint(manifest)


def test_the_spec_variant_pins_the_shipped_drafter_and_the_artifact_records_where_it_is():
    manifest = load_manifest(find_manifest("tiny-chat"))
    spec = manifest.speculative_for(manifest.variant("spec"))
    assert spec is not None and spec.drafter == "../checkpoints/tiny-chat/drafter"  # from the manifest's folder
    assert resolve_drafter(manifest, spec, 0) == (SHIPPED / "drafter").resolve()
    assert folder_digest(SHIPPED / "drafter") == spec.digest
    # artifact.json's manifest names the folder itself: verify reads it with no manifest path to start from
    recorded = Manifest.model_validate(recorded_manifest(start_build(manifest, manifest.variant("spec"))))
    assert recorded.path is None and recorded.speculative.drafter == str((SHIPPED / "drafter").resolve())
    assert resolve_drafter(recorded, recorded.speculative, 0) == (SHIPPED / "drafter").resolve()


def test_a_changed_drafter_file_is_refused(tmp_path):
    shutil.copytree(SHIPPED / "drafter", tmp_path / "drafter")
    data = yaml.safe_load(find_manifest("tiny-chat").read_text())
    data["speculative"]["drafter"] = "./drafter"  # relative: taken from the manifest's folder, not the cwd
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(data))
    manifest = load_manifest(tmp_path / "m.yaml")
    assert resolve_drafter(manifest, manifest.speculative, 0) == (tmp_path / "drafter").resolve()
    (tmp_path / "drafter" / "generation_config.json").write_text("{}\n")
    with pytest.raises(CheckpointError, match="speculative.digest"):
        resolve_drafter(manifest, manifest.speculative, 0)
    data["speculative"]["drafter"] = "./elsewhere"
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(data))
    missing = load_manifest(tmp_path / "m.yaml")
    with pytest.raises(CheckpointError, match="speculative.drafter './elsewhere': no such folder"):
        resolve_drafter(missing, missing.speculative, 0)


def _ids(tok, messages, tools=None):
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def test_the_target_answers_in_words_and_calls_the_tool(pair):
    target, _, tok = pair
    eos = set(target.generation_config.eos_token_id)
    answer = speculative.generate(target, _ids(tok, [{"role": "user", "content": "What is the capital of Italy?"}]), 16)
    assert tok.decode(answer.tokens, skip_special_tokens=True) == "The capital of Italy is Rome."
    ask = [{"role": "user", "content": "What is the weather in Oslo?"}]
    call = speculative.generate(target, _ids(tok, ask, [tiny_corpus.WEATHER_TOOL]), 24)
    assert tok.decode(call.tokens).startswith("<|tool_call>call:get_weather{city:")
    assert call.tokens[-1] in eos


def test_speculation_changes_no_token_and_the_drafter_is_accepted(pair):
    target, drafter, tok = pair
    spec = TinyChatSpec()
    chat, _ = speculative.workloads(tok, spec, 4, 0, (32, 0))
    eos = set(target.generation_config.eos_token_id)
    greedy = speculative.measure_method(target, chat, eos, None)
    drafted = speculative.measure_method(target, chat, eos, greedy["outputs"], assistant_model=drafter)
    looked_up = speculative.measure_method(target, chat, eos, greedy["outputs"], prompt_lookup_num_tokens=K)
    assert drafted["equals_greedy"] and looked_up["equals_greedy"]
    assert greedy["proposed"] == 0 and greedy["tokens_per_target_step"] == 1.0
    assert drafted["accepted"] == drafted["new_tokens"] - drafted["target_passes"]
    assert drafted["acceptance"] > 0.2 and drafted["tokens_per_target_step"] > 1.3  # a random drafter: ~0


def test_the_training_draft_rounds_are_the_drafters_own_forward_past_the_window(pair):
    """Every start position at once, behind masks, equals one query over the cropped cache, at a
    position past the sliding window (transformers' window there is inclusive)."""
    target, drafter, tok = pair
    text = "".join(tiny_corpus.render(tok, c) for c in tiny_corpus.edits(5, 3, tiny_corpus.HELD_OUT_STDLIB))
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"][:160]])
    window = target.config.sliding_window
    assert ids.shape[1] > window + 10
    embed = target.get_input_embeddings()
    hidden, kv = train_drafter.target_states(target, ids)
    with torch.no_grad():
        rounds = train_drafter.draft_rounds(drafter, embed, ids, hidden, kv, 2)
        for t in (3, window + 5, ids.shape[1] - 3):
            cache = {k: (v[0][:, :, :t], v[1][:, :, :t]) for k, v in kv.items()}
            state = hidden[:, t - 1 : t]
            for j in range(2):
                x = torch.cat([embed(ids[:, t + j : t + j + 1]), state], dim=-1)
                out = drafter(
                    inputs_embeds=x,
                    position_ids=torch.tensor([[t]]),
                    attention_mask=torch.ones(1, t, dtype=torch.long),
                    shared_kv_states=cache,
                )
                torch.testing.assert_close(out.logits[0, 0], rounds[j][0, t - 1], atol=1e-4, rtol=1e-4)
                state = out.last_hidden_state
