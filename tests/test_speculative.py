"""Speculative decoding, model side: the manifest's `speculative`, the verify pass and the drafter
(gemma4_port/port/drafter.py) through the runner, proven against transformers' Gemma-4 and its
assistant (gemma4_port/verify/speculative.py). The proofs run over the untraced graphs (eager_runner,
no compile); one compiled artifact shows the traced graphs and the loader carry them."""

import pytest
import torch

from contract.graph_key import GraphKey
from gemma4_port.source.checkpoint import resolve_drafter
from gemma4_port.source.manifest import load_manifest, parse_manifest
from gemma4_port.source.manifest_yaml import ManifestError
from gemma4_port.verify.agreement import Case
from gemma4_port.verify.reference import load_reference, reference_greedy
from gemma4_port.verify.speculative import draft_rows, load_reference_drafter, speculative_greedy
from runtime.model.loader import load_artifact
from support import MANIFESTS
from support.builds import eager_runner


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(8, 1000, (n,), generator=g)]


# Across the sliding windows (8 and 16) and the ring; one short.
PROMPTS = [_prompt(20, 1), _prompt(3, 2), _prompt(30, 3), _prompt(11, 4)]


@pytest.fixture(scope="module", params=["tiny-e2b", "tiny-12b"])
def eager(request):
    """(runner, build, target reference, drafter reference) for the manifest's `spec` variant."""
    runner, b = eager_runner(request.param, "spec")
    target = load_reference(b.ckpt)
    drafter = load_reference_drafter(resolve_drafter(b.manifest, b.manifest.speculative, b.geo.hidden))
    return runner, b, target, drafter


def test_the_drafters_proposals_and_the_verify_rows_are_the_references(eager):
    """From the same target state, every proposal and its logits are Gemma4AssistantForCausalLM's (the
    tied head on tiny-e2b, the centroid-masked ordered head on tiny-12b), and one verify pass gives
    the target's teacher-forced logits at the k + 1 positions, within the float32 bounds."""
    runner, b, target, drafter = eager
    assert runner.draft_k == 3 and runner.verify_max == 4 and b.geo.drafter.ordered == (b.manifest.name == "tiny-12b")
    rows = draft_rows(runner, target, drafter, [Case(f"p{i}", ids, 3) for i, ids in enumerate(PROMPTS[:3])], "float32")
    assert [r.case.name for r in rows[:2]] == ["draft:p0", "verify:p0"]
    bad = [(r.case.name, r.verdict, r.note) for r in rows if r.verdict != "MATCH"]
    assert not bad
    assert all(r.compared == (3 if r.case.name.startswith("draft") else 4) for r in rows)


def test_greedy_with_speculation_is_the_targets_greedy_in_every_slot(eager):
    runner, b, target, _ = eager
    prompts = PROMPTS[: b.geo.batch]
    for ids, (tokens, logits) in zip(prompts, speculative_greedy(runner, prompts, 8)):
        want, _ = reference_greedy(target, ids, 8)
        assert tokens == want
        assert len(logits) == 8
    assert all(s.free for s in runner.slots)


def test_accept_keeps_a_prefix_and_the_next_round_starts_from_its_hidden_state(eager):
    """Accepting 2 of 4 verified tokens leaves the slot as if it had decoded those 2: its length, its
    tokens, the next decode's logits and the drafter's next proposal."""
    runner, *_ = eager
    ids = PROMPTS[0]
    first = int(runner.prefill_prompt(0, ids).argmax())
    run = [first, 5, 6, 7]
    runner.verify({0: run})
    runner.accept(0, 2)
    s = runner.slots[0]
    assert (s.position, s.tokens) == (len(ids) + 2, ids + run[:2])
    with pytest.raises(RuntimeError, match="slot 0 has no verify to accept from"):
        runner.accept(0, 1)
    draft_after_accept = runner.draft({0: 9})[0]
    decoded = runner.decode({0: 9})[0]
    runner.free(0)
    runner.prefill_prompt(0, ids)
    runner.decode({0: first})
    runner.decode({0: 5})
    torch.testing.assert_close(runner.draft({0: 9})[0], draft_after_accept, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(runner.decode({0: 9})[0], decoded, rtol=1e-5, atol=1e-5)
    runner.free(0)


def test_a_verify_that_cannot_fit_is_refused_by_name(eager):
    runner, *_ = eager
    runner.prefill_prompt(0, PROMPTS[1])
    try:
        with pytest.raises(ValueError, match="a verify takes 1 to 4 tokens per slot, not 5"):
            runner.verify({0: [1, 2, 3, 4, 5]})
        runner.slots[0].position = runner.geo.kv_max - 2
        with pytest.raises(Exception, match="3 more exceed kv_max=64"):
            runner.verify({0: [1, 2, 3]})
    finally:
        runner.free(0)
    with pytest.raises(RuntimeError, match="slot 0 has no prompt"):
        runner.draft({0: 5})


RANDOM = load_manifest(MANIFESTS / "tiny-e2b.yaml").speculative.random.model_dump(mode="json")


def _manifest(**spec):
    m = load_manifest(MANIFESTS / "tiny-e2b.yaml").model_dump(mode="json")
    return m | {"speculative": spec}


@pytest.mark.parametrize(
    "spec, error",
    [
        ({"k": 32}, "speculative.k: Input should be less than or equal to 16"),
        (
            {"k": 16, "variants": ["chunks"]},
            "variant .chunks. verifies k \\+ 1 = 17 tokens, more than its largest bucket",
        ),
        ({"k": 3, "variants": ["nope"]}, "speculative.variants \\['nope'\\] are not variants of this manifest"),
        ({"k": 3, "revision": "main"}, "`revision` pins a `drafter` repo"),
        ({"k": 3, "drafter": "not a repo!"}, "is not a hub repo id nor a local folder"),
        ({"k": 3, "drafter": "google/x", "random": RANDOM}, "give at most one of `drafter`"),
        ({"k": 3, "draftr": "google/x"}, "speculative.draftr: unknown field; allowed here: k, drafter, revision"),
        ({"k": 3, "random": {"config": {"num_hidden_layers": 2, "hidden_size_per_layer_input": 8}}}, "hidden_size_per"),
    ],
)
def test_a_bad_speculative_section_is_named(spec, error):
    with pytest.raises(ManifestError, match=error):
        parse_manifest(_manifest(**spec), "m.yaml")


def test_prompt_lookup_needs_no_drafter():
    m = parse_manifest(_manifest(k=4, variants=["spec"]), "m.yaml")
    assert m.speculative_for(m.variant("spec")).has_drafter is False
    assert m.speculative_for(m.variant("fp32")) is None


def test_the_compiled_artifact_verifies_and_drafts_as_the_untraced_graphs(compiled, eager):
    runner, b, *_ = eager
    if b.manifest.name != "tiny-e2b":
        pytest.skip("one compiled artifact: tiny-e2b spec")
    model = load_artifact(compiled("tiny-e2b", "spec"))
    graphs = set(model.meta.graphs)
    assert {"verify_4_32", "verify_4_64", "draft_32", "draft_64"} <= graphs
    assert GraphKey.parse("verify_4_64") == GraphKey.verify(4, 64)
    try:
        for r in (model.runner, runner):
            r.prefill_prompt(2, PROMPTS[2])
        got = [r.verify({2: [11, 12, 13, 14]})[2] for r in (model.runner, runner)]
        torch.testing.assert_close(got[0], got[1], rtol=1e-5, atol=1e-5)
        for r in (model.runner, runner):
            r.accept(2, 3)
        drafts = [r.draft({2: 13})[2] for r in (model.runner, runner)]
        torch.testing.assert_close(drafts[0], drafts[1], rtol=1e-5, atol=1e-5)
    finally:
        runner.free(2)
        model.close()


@pytest.mark.parametrize("name", ["gemma-4-e2b", "gemma-4-e4b", "gemma-4-12b"])
def test_the_shipped_manifests_name_their_hub_drafters_and_their_assumed_shapes_plan(name):
    """Offline, with no weights: each names Google's assistant with a revision; its assumed config is a
    valid Gemma4AssistantConfig for the target (every layer kv-shared, reading a target cache of its own
    head shape, on every rank of each variant it applies to), and `plan` counts its weights and graphs."""
    from gemma4_port.ops.capacity import footprint, model_sizes
    from gemma4_port.port.sharding import shard_drafter
    from gemma4_port.source.configs import drafter_config_for

    manifest = load_manifest(MANIFESTS / f"{name}.yaml")
    spec = manifest.speculative
    assert spec.drafter == manifest.model.source + "-assistant" and spec.revision and spec.k == 3
    config = drafter_config_for(manifest)
    config.validate_architecture()
    assert config.text_config.num_kv_shared_layers == config.text_config.num_hidden_layers == 4
    assert config.use_ordered_embeddings == (name == "gemma-4-12b")
    sizes = model_sizes(manifest)
    variants = [v for v in manifest.variants if spec.applies_to(v.name)]
    assert variants
    for v in variants:
        for rank in range(v.tp):
            assert shard_drafter(config, sizes.shard(v.tp, rank)).backbone == sizes.shard(1, 0).hidden
        fp = footprint(sizes, v)
        assert fp.fits_core and fp.drafter_weights > 0 and {"verify", "draft"} <= set(fp.layout.keys)
