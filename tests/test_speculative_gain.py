"""The speculative gain on the decode roofline (ops/speculative_gain.py), on the real E2B config."""

import pytest

from gemma4_port.ops.model_sizes import ModelSizes
from gemma4_port.ops.roofline import CORE_BYTES_PER_S, roofline
from gemma4_port.ops.speculative_gain import Speculation, drafter_step_bytes, speculation
from gemma4_port.source.configs import text_config_for
from gemma4_port.source.manifest import load_manifest
from support import MANIFESTS


@pytest.fixture(scope="module")
def e2b():
    manifest = load_manifest(MANIFESTS / "gemma-4-e2b.yaml")
    return manifest.variant("512-128"), ModelSizes(text_config_for(manifest))


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


def test_a_drafter_step_reads_a_small_share_of_a_decode_step(e2b):
    """Four kv-shared layers and a centroid head against 35 layers and the whole 262k-row head."""
    v, sizes = e2b
    draft = drafter_step_bytes(sizes, v, 4096)
    step = roofline(sizes, v, 4096, 1)
    assert 0.01 < draft / (step.weight_bytes + step.kv_bytes + step.tail_bytes) < 0.15
    s = speculation(sizes, v, 4096, 3, 0.7, drafter=True)
    assert s.draft_s == pytest.approx(draft / CORE_BYTES_PER_S) and s.verify_s == s.decode_s == step.step_s()
