"""Chunked prefill at any offset and window-sized sliding rings, in the eager graph against
transformers: a prompt longer than every bucket, split into chunks at arbitrary offsets, gives the
reference's logits after every chunk and its greedy continuation to kv_max; other slots and stale
positions are never touched or read."""

from pathlib import Path

import pytest
import torch

from gemma4_port.checkpoint import CheckpointReader, read_text_config, resolve_checkpoint
from gemma4_port.compile import geometry, host_tables, trace_quietly
from gemma4_port.graphs import DecodeGraph, PrefillGraph
from gemma4_port.lint import check_traced
from gemma4_port.manifest import load_manifest
from gemma4_port.model import Gemma4Decoder
from gemma4_port.reference import load_reference
from gemma4_port.sharding import shard_model
from runtime.hostside import HostInputs
from runtime.sampling import softcap

ROOT = Path(__file__).resolve().parents[1]
TINY = ["tiny-e2b", "tiny-e4b", "tiny-12b"]
TOL = 2e-3


def _setup(name, variant="fp32"):
    manifest = load_manifest(ROOT / f"manifests/{name}.yaml")
    folder = resolve_checkpoint(manifest)
    config = read_text_config(folder)
    reader = CheckpointReader(folder)
    shard = shard_model(config)
    geo = geometry(config, shard, manifest.variant(variant))
    decoder = Gemma4Decoder(shard, torch.float32)
    decoder.load_weights(reader)
    return folder, geo, decoder, HostInputs(geo, host_tables(reader, geo))


def _prompt(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(8, 1024, (n,), generator=g)]


@torch.no_grad()
def _reference_logits(ref, ids):
    return ref(input_ids=torch.tensor([ids]), logits_to_keep=1).logits[0, -1].float()


@torch.no_grad()
def _prefill(prefill, host, ids, chunks, buckets, slot, kv):
    """Prefill `ids` in chunks of the given sizes into the given buckets; logits after each chunk."""
    start, seen = 0, []
    for n, bucket in zip(chunks, buckets):
        logits, *kv = prefill(*host.prefill(ids[start:start + n], bucket, slot, kv, start=start))
        start += n
        seen.append((start, logits[0]))
    assert start == len(ids)
    return seen, kv


def test_sliding_layers_keep_a_ring_of_window_plus_a_chunk():
    _, geo, _, _ = _setup("tiny-12b")
    assert geo.ring == geo.sliding_window + geo.buckets[-1] < geo.kv_max  # 16 + 32 < 64: the tests wrap it
    spans = {shape[2] for shape in geo.kv_shapes}
    assert spans == {geo.ring, geo.kv_max}


@torch.no_grad()
@pytest.mark.parametrize("name", TINY)
def test_a_prompt_longer_than_every_bucket_matches_transformers_chunk_by_chunk(name):
    """50 tokens (the largest bucket is 32) in chunks at offsets 0, 7, 23, 43, through the ring (40
    or 48 positions) and the window, then greedy decoding to kv_max wraps the ring again."""
    folder, geo, decoder, host = _setup(name)
    ref = load_reference(folder)
    prefill, decode = PrefillGraph(decoder), DecodeGraph(decoder)
    ids = _prompt(50)
    kv = [torch.zeros(s) for s in geo.kv_shapes]
    seen, kv = _prefill(prefill, host, ids, [7, 16, 20, 7], [16, 16, 32, 16], 0, kv)
    for end, logits in seen:
        want = _reference_logits(ref, ids[:end])
        assert float((softcap(logits, geo.softcap) - want).abs().max()) < TOL, f"after {end} tokens"
    logits, tokens = seen[-1][1], list(ids)
    while len(tokens) < geo.kv_max:
        want = _reference_logits(ref, tokens)
        assert float((softcap(logits, geo.softcap) - want).abs().max()) < TOL, f"at position {len(tokens)}"
        assert int(logits.argmax()) == int(want.argmax())
        tokens.append(int(logits.argmax()))
        if len(tokens) < geo.kv_max:
            logits, *kv = decode(*host.decode([tokens[-1]], [len(tokens) - 1], kv))
            logits = logits[0]


@torch.no_grad()
def test_other_slots_are_untouched_and_stale_positions_never_read():
    """A chunk into slot 2 of 4 writes only its own positions of slot 2; a slot full of an earlier
    request's garbage (huge values past the new prompt, and in every other slot) changes nothing."""
    folder, geo, decoder, host = _setup("tiny-e2b", "b4")
    prefill = PrefillGraph(decoder)
    ids = _prompt(45, seed=1)
    clean = [torch.zeros(s) for s in geo.kv_shapes]
    g = torch.Generator().manual_seed(3)
    dirty = [1e4 * torch.randn(s, generator=g) for s in geo.kv_shapes]
    seen_clean, kv_clean = _prefill(prefill, host, ids, [32, 13], [32, 16], 2, clean)
    seen_dirty, kv_dirty = _prefill(prefill, host, ids, [32, 13], [32, 16], 2, dirty)
    for (_, a), (_, b) in zip(seen_clean, seen_dirty):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for old, new, fresh in zip(dirty, kv_dirty, kv_clean):
        others = [0, 1, 3]
        assert torch.equal(new[others], old[others])
        S = old.shape[2]
        written = torch.zeros(S, dtype=torch.bool)
        written[[p % S for p in range(len(ids))]] = True
        assert torch.equal(new[2][:, written], fresh[2][:, written])  # the prompt's own K/V, whatever was there
        assert torch.equal(new[2][:, ~written], old[2][:, ~written])  # the rest as it was
    want = _reference_logits(load_reference(folder), ids)
    assert float((softcap(seen_dirty[-1][1], geo.softcap) - want).abs().max()) < TOL


@torch.no_grad()
def test_how_a_prompt_is_chunked_does_not_change_the_result():
    _, geo, decoder, host = _setup("tiny-e4b")
    prefill = PrefillGraph(decoder)
    ids = _prompt(40, seed=2)
    results = []
    for chunks, buckets in (([32, 8], [32, 16]), ([1] * 40, [16] * 40), ([16, 16, 8], [16, 16, 16])):
        seen, kv = _prefill(prefill, host, ids, chunks, buckets, 0, [torch.zeros(s) for s in geo.kv_shapes])
        results.append((seen[-1][1], kv))
    for logits, kv in results[1:]:
        torch.testing.assert_close(logits, results[0][0], rtol=1e-4, atol=1e-4)
        for a, b in zip(kv, results[0][1]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_chunk_inputs_are_the_rows_of_their_definition():
    """Each chunk token's mask row sees exactly the keys (p - window, p] of its own position q (the
    ring key j holding q - ((q - j) mod S)) and its write row names q mod S; padding sees and writes nothing."""
    _, geo, _, host = _setup("tiny-e2b")
    start, n, bucket = 37, 9, 16
    named = dict(zip(geo.inputs["prefill"], host.prefill(list(range(1, n + 1)), bucket, 0, start=start)))
    for kind in geo.kinds:
        S, rows = geo.span(kind), named[f"rows_{kind}"]
        assert rows.shape == (bucket, 2, S)
        j = torch.arange(S)
        for i in range(bucket):
            if i >= n:
                assert not rows[i, 1].any() and not (rows[i, 0] == 0).any()
                continue
            q = start + i
            held = q - (q - j) % S  # the position key j holds once q is written
            visible = held >= 0
            if kind == "sliding":
                visible &= held > q - geo.sliding_window
            assert torch.equal(rows[i, 0] == 0, visible), (kind, q)
            assert torch.equal(rows[i, 1], (j == q % S).to(host.dtype)), (kind, q)
    assert torch.equal(named["last"][0], torch.nn.functional.one_hot(torch.tensor(n - 1), bucket).float())
    with pytest.raises(ValueError, match="does not fit kv_max"):
        host.prefill([1] * 9, 16, 0, start=geo.kv_max - 8)


def test_the_chunk_graph_traces_without_scatter_or_indexing():
    _, geo, decoder, host = _setup("tiny-12b")
    kv = tuple(torch.zeros(s) for s in geo.kv_shapes)
    inputs = host.prefill([5] * 10, 16, 0, kv, start=20)
    check_traced(trace_quietly(torch.jit.trace, PrefillGraph(decoder).eval(), inputs), "prefill_16", geo.vocab)
