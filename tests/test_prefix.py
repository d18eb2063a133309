"""Prefix reuse: the rule for how much of a slot's retained KV a new prompt keeps, and the choice of a
slot. (That a reused prefix gives exactly what a fresh prefill gives, and that what the rule refuses
would not, is shown on the graph in test_decoder.py.)"""

import pytest

from gemma4_port.compile.tracing import geometry
from gemma4_port.port.sharding import shard_model
from gemma4_port.source.configs import text_config_for
from gemma4_port.source.manifest import load_manifest
from runtime.model.prefix import choose_slot, forkable, reusable_prefix
from support import MANIFESTS


@pytest.fixture(scope="module")
def geo():
    manifest = load_manifest(MANIFESTS / "tiny-e2b.yaml")
    config = text_config_for(manifest)
    return geometry(config, shard_model(config), manifest.variant("b4"))  # window 8, ring 8 + 32, kv_max 64


def test_the_shared_prefix_is_kept_less_the_last_prompt_token(geo):
    retained = list(range(100, 130))  # 30 positions held
    assert reusable_prefix(geo, retained, retained[:20] + [7, 8]) == 20
    assert reusable_prefix(geo, retained, retained[:20]) == 19  # the last token must run for its logits
    assert reusable_prefix(geo, retained, retained + [1, 2, 3]) == 30
    assert reusable_prefix(geo, retained, [5] + retained) == 0


def test_a_ring_that_has_moved_on_past_the_prefix_is_not_reused(geo):
    assert geo.ring - geo.sliding_window == 32  # how far the retained KV may run past the prefix
    retained = list(range(100, 160))  # 60 positions: the ring (40) has wrapped
    assert reusable_prefix(geo, retained, retained[:27] + [1]) == 27  # 59 - 27 = 32: still whole
    assert reusable_prefix(geo, retained, retained[:26] + [1]) == 0  # 33: keys before 26 are overwritten


def test_the_ring_counts_from_the_furthest_write_not_from_the_retained_tokens(geo):
    """A slot cut back to 30 tokens whose writes once reached 60 positions: the ring lost keys the
    tokens alone would not say; a fork's copy of the prompt obeys the same rule."""
    retained = list(range(100, 130))
    assert reusable_prefix(geo, retained, retained + [1], reach=60) == 30  # 59 - 30 = 29
    assert reusable_prefix(geo, retained, retained[:27] + [1], reach=60) == 27  # 59 - 27 = 32
    assert reusable_prefix(geo, retained, retained[:26] + [1]) == 26  # by its tokens: 29 - 26 = 3
    assert reusable_prefix(geo, retained, retained[:26] + [1], reach=60) == 0  # by its writes: 59 - 26 = 33
    assert choose_slot(geo, {1: retained, 2: retained[:20]}, retained[:20] + [1], reach={1: 64, 2: 20}) == (2, 20)
    assert forkable(geo, retained, retained[:20], 52) and not forkable(geo, retained, retained[:20], 54)
    assert not forkable(geo, retained, [1] + retained[:19], 30)


def test_the_slot_with_the_longest_reusable_prefix_wins(geo):  # the smallest bucket is 16
    a, b = list(range(100, 130)), list(range(200, 230))
    prompt = b[:20] + [1, 2]
    assert choose_slot(geo, {0: None, 1: a, 2: b, 3: b[:17]}, prompt) == (2, 20)
    assert choose_slot(geo, {1: a, 3: None, 2: b[:10]}, prompt) == (3, 0)  # 10 < a bucket: an empty slot
    assert choose_slot(geo, {1: a, 2: b[:10]}, prompt) == (1, 0)  # none empty: the first in the caller's order
