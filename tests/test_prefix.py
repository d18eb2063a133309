"""Prefix reuse: the rule for how much of a slot's retained KV a new prompt keeps, the choice of a
slot, and (in the eager graph) that a reused prefix gives exactly what a fresh prefill gives, while
the positions the rule refuses would not."""

from pathlib import Path

import pytest
import torch

from gemma4_port.checkpoint import CheckpointReader, read_text_config, resolve_checkpoint
from gemma4_port.compile import geometry, host_tables
from gemma4_port.graphs import PrefillGraph
from gemma4_port.manifest import load_manifest
from gemma4_port.model import Gemma4Decoder
from gemma4_port.sharding import shard_model
from runtime.hostside import HostInputs
from runtime.prefix import choose_slot, reusable_prefix
from runtime.runner import chunks

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny():
    manifest = load_manifest(ROOT / "manifests/tiny-e2b.yaml")
    folder = resolve_checkpoint(manifest)
    config, reader = read_text_config(folder), CheckpointReader(folder)
    shard = shard_model(config)
    geo = geometry(config, shard, manifest.variant("b4"))  # window 8, ring 8 + 32, kv_max 64, batch 4
    decoder = Gemma4Decoder(shard, torch.float32)
    decoder.load_weights(reader)
    return geo, PrefillGraph(decoder), HostInputs(geo, host_tables(reader, geo))


def test_the_shared_prefix_is_kept_less_the_last_prompt_token(tiny):
    geo = tiny[0]
    retained = list(range(100, 130))  # 30 positions held
    assert reusable_prefix(geo, retained, retained[:20] + [7, 8]) == 20
    assert reusable_prefix(geo, retained, retained[:20]) == 19  # the last token must run for its logits
    assert reusable_prefix(geo, retained, retained + [1, 2, 3]) == 30
    assert reusable_prefix(geo, retained, [5] + retained) == 0


def test_a_ring_that_has_moved_on_past_the_prefix_is_not_reused(tiny):
    geo = tiny[0]
    assert geo.ring - geo.sliding_window == 32  # how far the retained KV may run past the prefix
    retained = list(range(100, 160))  # 60 positions: the ring (40) has wrapped
    assert reusable_prefix(geo, retained, retained[:27] + [1]) == 27  # 59 - 27 = 32: still whole
    assert reusable_prefix(geo, retained, retained[:26] + [1]) == 0  # 33: keys before 26 are overwritten


def test_the_slot_with_the_longest_reusable_prefix_wins(tiny):
    geo = tiny[0]  # smallest bucket 16
    a, b = list(range(100, 130)), list(range(200, 230))
    prompt = b[:20] + [1, 2]
    assert choose_slot(geo, {0: None, 1: a, 2: b, 3: b[:17]}, prompt) == (2, 20)
    assert choose_slot(geo, {1: a, 3: None, 2: b[:10]}, prompt) == (3, 0)  # 10 < a bucket: an empty slot
    assert choose_slot(geo, {1: a, 2: b[:10]}, prompt) == (1, 0)  # none empty: the first in the caller's order


@torch.no_grad()
def _prefill(graph, host, ids, slot, kv, start=0):
    for first, n, bucket in chunks(start, len(ids), host.geo.buckets):
        logits, *kv = graph(*host.prefill(ids[first:first + n], bucket, slot, kv, start=first))
    return logits[0], kv


@torch.no_grad()
@pytest.mark.parametrize("retained_len, shared", [(50, 45), (60, 27), (20, 16)])
def test_a_reused_prefix_gives_what_a_fresh_prefill_gives(tiny, retained_len, shared):
    geo, graph, host = tiny
    g = torch.Generator().manual_seed(retained_len)
    old = [int(t) for t in torch.randint(8, geo.vocab, (retained_len,), generator=g)]
    new = old[:shared] + [int(t) for t in torch.randint(8, geo.vocab, (10,), generator=g)]
    assert reusable_prefix(geo, old, new) == shared
    empty = [torch.zeros(s) for s in geo.kv_shapes]
    _, kv = _prefill(graph, host, old, 1, empty)  # slot 1 retains `old`
    reused, _ = _prefill(graph, host, new, 1, kv, start=shared)
    fresh, _ = _prefill(graph, host, new, 1, empty)
    torch.testing.assert_close(reused, fresh, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_what_the_rule_refuses_would_read_overwritten_keys(tiny):
    """60 retained positions and a prefix of 20: the ring no longer holds keys 12..19 that the new
    tokens' windows need. Forcing the reuse anyway gives other logits: the rule is what stops it."""
    geo, graph, host = tiny
    g = torch.Generator().manual_seed(7)
    old = [int(t) for t in torch.randint(8, geo.vocab, (60,), generator=g)]
    new = old[:20] + [int(t) for t in torch.randint(8, geo.vocab, (10,), generator=g)]
    assert reusable_prefix(geo, old, new) == 0
    empty = [torch.zeros(s) for s in geo.kv_shapes]
    _, kv = _prefill(graph, host, old, 0, empty)
    forced, _ = _prefill(graph, host, new, 0, kv, start=20)
    fresh, _ = _prefill(graph, host, new, 0, empty)
    assert float((forced - fresh).abs().max()) > 1e-2
