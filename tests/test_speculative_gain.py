"""The speculative gain on the decode roofline (ops/speculative_gain.py), on the real E2B config and
its drafter's assumed config, as plan counts them."""

import pytest

from gemma4_port.ops.capacity import model_sizes
from gemma4_port.ops.model_sizes import ModelSizes
from gemma4_port.ops.roofline import CORE_BYTES_PER_S, roofline
from gemma4_port.ops.speculative_gain import (
    Speculation,
    break_even_acceptance,
    drafter_step_bytes,
    head_rows,
    speculation,
)
from gemma4_port.source.configs import ASSUMED_DRAFTER_CONFIGS
from gemma4_port.source.manifest import load_manifest
from support import MANIFESTS


@pytest.fixture(scope="module")
def e2b():
    manifest = load_manifest(MANIFESTS / "gemma-4-e2b.yaml")
    return manifest.variant("512-128"), model_sizes(manifest)


def _with_head(sizes: ModelSizes, ordered: bool) -> ModelSizes:
    """The same target and drafter, the drafter's head tied or centroid-masked."""
    from transformers import Gemma4AssistantConfig

    fields = ASSUMED_DRAFTER_CONFIGS["google/gemma-4-E2B-it-assistant"] | {"use_ordered_embeddings": ordered}
    return ModelSizes(sizes.config, speculative=sizes.speculative, drafter_config=Gemma4AssistantConfig(**fields))


@pytest.mark.parametrize(("a", "k", "expected"), [(0.0, 3, 1.0), (1.0, 3, 4.0), (0.5, 3, 1.875), (0.8, 2, 2.44)])
def test_tokens_per_round_follow_the_geometric_acceptance(a, k, expected):
    s = Speculation("v", 128, k, a, decode_s=1.0, verify_s=1.0, draft_s=0.0)
    assert s.tokens_per_round == pytest.approx(expected)
    assert s.gain == pytest.approx(expected)  # free drafts: the gain is the tokens a round emits


def test_prompt_lookup_that_never_hits_gains_nothing_and_a_drafter_that_never_hits_loses(e2b):
    v, sizes = e2b
    assert speculation(sizes, v, 4096, 3, 0.0, drafter=False).gain == pytest.approx(1.0)
    assert speculation(sizes, v, 4096, 3, 0.0, drafter=True).gain < 1.0


def test_the_gain_grows_with_acceptance_and_is_bounded_by_k_plus_one(e2b):
    v, sizes = e2b
    gains = [speculation(sizes, v, 4096, 3, a, drafter=True).gain for a in (0.2, 0.5, 0.8, 1.0)]
    assert gains == sorted(gains) and gains[-1] < 4.0


def test_a_drafter_step_reads_the_drafter_plan_counts(e2b):
    """The tied head's whole 262k-row embedding every step, beside four kv-shared layers: plan's drafter
    weights at the variant dtype plus the K/V it attends to."""
    v, sizes = e2b
    draft = drafter_step_bytes(sizes, v, 4096)
    weights = 2 * sizes.drafter_weights(1, 0)  # bfloat16, the head included
    assert head_rows(sizes) == 262_144 and weights < draft < weights + 2**26
    step = roofline(sizes, v, 4096, 1)
    assert 0.1 < draft / (step.weight_bytes + step.kv_bytes + step.tail_bytes) < 0.3
    s = speculation(sizes, v, 4096, 3, 0.7, drafter=True)
    assert s.draft_s == pytest.approx(draft / CORE_BYTES_PER_S) and s.verify_s == s.decode_s == step.step_s()


def test_a_tied_head_drafter_gains_less_than_the_same_drafter_with_the_centroid_head(e2b):
    """A tied head reads all 262,144 rows a step, the centroid head 2,048 centroids and 32 x 128 rows."""
    v, sizes = e2b
    tied, ordered = _with_head(sizes, False), _with_head(sizes, True)
    assert head_rows(tied) == 262_144 and head_rows(ordered) == 32 * 128
    bytes_tied, bytes_ordered = (drafter_step_bytes(s, v, 4096) for s in (tied, ordered))
    assert bytes_tied - bytes_ordered == 2 * 1536 * (262_144 - 4096 - 2048)  # bf16 rows less centroids
    for a in (0.3, 0.5, 0.7):
        assert (
            speculation(tied, v, 4096, 3, a, drafter=True).gain < speculation(ordered, v, 4096, 3, a, drafter=True).gain
        )
    assert break_even_acceptance(ordered, v, 4096, 3) < break_even_acceptance(tied, v, 4096, 3)


def test_the_break_even_acceptance_is_where_the_gain_is_one(e2b):
    v, sizes = e2b
    a = break_even_acceptance(sizes, v, 4096, 3)
    assert 0 < a < 1
    assert speculation(sizes, v, 4096, 3, a, drafter=True).gain == pytest.approx(1.0, abs=1e-6)
    assert (
        speculation(sizes, v, 4096, 3, a - 0.05, drafter=True).gain
        < 1
        < speculation(sizes, v, 4096, 3, a + 0.05, drafter=True).gain
    )


def test_plan_says_where_the_drafter_does_not_pay_and_which_head_it_has():
    from gemma4_port.ops.capacity import footprint
    from gemma4_port.ops.plan import speculation_lines

    manifest = load_manifest(MANIFESTS / "gemma-4-e4b.yaml")
    sizes = model_sizes(manifest)
    fps = [footprint(sizes, manifest.variant(name)) for name in ("tp1-48k", "tp2-48k")]
    tp1, tp2, drafter = speculation_lines(manifest, sizes, fps)
    assert "does not pay" not in tp1 and "speculation does not pay" in tp2  # 0.94x at acceptance 0.5
    assert "google/gemma-4-E4B-it-assistant, assumed shapes" in drafter and "tied head" in drafter


def test_a_folder_drafter_is_read_from_the_manifests_own_folder():
    """tiny-chat names its drafter folder relative to the manifest: plan and the gain read its config.json."""
    from gemma4_port.source.configs import drafter_config_source

    manifest = load_manifest(MANIFESTS / "tiny-chat.yaml")
    sizes = model_sizes(manifest)
    assert drafter_config_source(manifest) == str(MANIFESTS.parent / "checkpoints/tiny-chat/drafter/config.json")
    assert sizes.drafter_config is not None and head_rows(sizes) == sizes.shard(1, 0).vocab  # its tied head
    assert drafter_step_bytes(sizes, manifest.variant("spec"), 512) > 4 * sizes.drafter_weights(1, 0)  # fp32
