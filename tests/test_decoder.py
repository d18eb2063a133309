"""The device graph (eager, before tracing) against transformers, and its strict weight loading."""

import pytest
import torch
from safetensors.torch import load_file, save_file

from contract.greedy import softcap
from gemma4_port.compile.tracing import trace_quietly
from gemma4_port.port.decoder import Gemma4Decoder, WeightError
from gemma4_port.port.graphs import DecodeGraph, PrefillGraph
from gemma4_port.port.kv import copy_slot
from gemma4_port.port.lint import check_traced
from gemma4_port.source.checkpoint_files import CheckpointError, CheckpointReader
from gemma4_port.verify.reference import load_reference, reference_greedy
from runtime.model.prefix import reusable_prefix
from runtime.model.prompt_chunks import chunks
from support.builds import setup
from support.copies import check_copied, planted_kv

TINY = ["tiny-e2b", "tiny-e4b", "tiny-12b"]
CHUNK_TOL = 2e-3


@torch.no_grad()
@pytest.mark.parametrize("name", TINY)
def test_prefill_and_decode_match_transformers(name):
    folder, config, shard, geo, decoder, host = setup(name)
    prefill, decode = PrefillGraph(decoder), DecodeGraph(decoder)
    ids = [2, 17, 300, 41, 999, 5, 77, 123, 640, 12, 9]  # 11 tokens: crosses the sliding window of 8
    steps = 20  # decode past the window too
    ref_tokens, ref_logits = reference_greedy(load_reference(folder), ids, steps)
    kv = [torch.zeros(s) for s in geo.kv_shapes]
    logits, *kv = prefill(*host.prefill_inputs(ids, 16, 0, kv))
    got = []
    for i in range(steps):
        row = logits[0, : geo.vocab]  # a graph's rows: the logits, then the hidden state
        assert float((softcap(row, geo.softcap) - ref_logits[i]).abs().max()) < 2e-3, f"step {i}"
        got.append(int(row.argmax()))
        logits, *kv = decode(*host.decode_inputs([got[-1]], [len(ids) + i], kv))
    assert got == ref_tokens


def test_kv_buffers_only_for_layers_that_own_a_cache():
    _, config, shard, geo, decoder, _ = setup("tiny-e2b")
    first_shared = config.num_hidden_layers - config.num_kv_shared_layers
    assert shard.cache_layers == tuple(range(first_shared))
    assert len(geo.kv_shapes) == 2 * first_shared
    kinds = [shard.layers[i].kind for i in shard.cache_layers for _ in "kv"]
    assert [shape[2] for shape in geo.kv_shapes] == [geo.span(kind) for kind in kinds]
    # every kv-shared layer reads the last non-shared layer of its own attention type
    for s in shard.layers[first_shared:]:
        owner = shard.layers[shard.cache_layers[s.cache]]
        assert owner.kind == s.kind
        assert config.kv_sharing_modes[owner.index] == "store"
    shared = decoder.layers[first_shared].self_attn
    assert not hasattr(shared, "k_proj") and not hasattr(shared, "v_proj")


def test_k_eq_v_global_layer_has_no_v_proj():
    _, _, shard, _, decoder, _ = setup("tiny-12b")
    full = [layer for layer in decoder.layers if layer.shard.kind == "full"]
    assert full and all(layer.self_attn.v_proj is None for layer in full)
    assert all(layer.shard.kv_heads == 1 for layer in full)


@pytest.mark.parametrize("drop", ["layers.2.layer_scalar", "layers.0.self_attn.k_norm.weight", "norm.weight"])
def test_a_missing_checkpoint_tensor_fails_by_name(tmp_path, drop):
    folder, config, shard, *_ = setup("tiny-e2b")
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["model.language_model." + drop]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=f"checkpoint has no tensor '{drop}'"):
        Gemma4Decoder(shard).load_weights(CheckpointReader(tmp_path))


def test_a_wrong_shape_fails_by_name(tmp_path):
    folder, config, shard, *_ = setup("tiny-e2b")
    tensors = load_file(str(folder / "model.safetensors"))
    key = "model.language_model.layers.1.mlp.up_proj.weight"
    tensors[key] = tensors[key][:-1]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(WeightError, match="layers.1.mlp.up_proj.weight"):
        Gemma4Decoder(shard).load_weights(CheckpointReader(tmp_path))


def test_every_module_tensor_is_mapped_and_layer_scalar_is_loaded():
    *_, decoder, _ = setup("tiny-e4b")
    names = {e.name for e in decoder.weight_map()}
    assert names == set(dict(decoder.named_parameters())) | set(dict(decoder.named_buffers()))
    scalars = torch.stack([layer.layer_scalar for layer in decoder.layers])
    assert not torch.isnan(scalars).any() and float((scalars - 1).abs().min()) > 0.4


@torch.no_grad()
def test_a_decode_bucket_computes_what_the_whole_cache_does():
    """Below the bucket's T keys, attending over T and rewriting only them gives the same logits and
    the same whole buffers as the kv_max graph (the tail comes back untouched)."""
    *_, geo, decoder, host = setup("tiny-e2b", "b4")
    graph = DecodeGraph(decoder)
    g = torch.Generator().manual_seed(0)
    kv = [torch.randn(s, generator=g) for s in geo.kv_shapes]  # a used cache: every position non-zero
    tokens, positions = [5, None, 700, 31], [3, 0, 31, 17]
    small, *kv_small = graph(*host.decode_inputs(tokens, positions, kv, keys=32))
    whole, *kv_whole = graph(*host.decode_inputs(tokens, positions, kv, keys=64))
    busy = [0, 2, 3]
    torch.testing.assert_close(small[busy], whole[busy], rtol=1e-5, atol=1e-5)
    for a, b, old in zip(kv_small, kv_whole, kv):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert torch.equal(a[:, :, 32:], old[:, :, 32:])
    with pytest.raises(ValueError, match="key buckets"):
        host.decode_inputs(tokens, positions, kv, keys=48)


@torch.no_grad()
def test_a_prefill_key_bucket_computes_what_the_whole_cache_does():
    """A chunk whose positions end below T: attending over T keys and rewriting only them gives the
    kv_max graph's logits and whole buffers; every other slot and the tail come back untouched."""
    *_, geo, decoder, host = setup("tiny-e2b", "b4")  # key buckets 32, 64; ring 40
    graph = PrefillGraph(decoder)
    g = torch.Generator().manual_seed(1)
    kv = [torch.randn(s, generator=g) for s in geo.kv_shapes]  # a used cache: every position non-zero
    ids = _prompt(11, seed=4)
    small, *kv_small = graph(*host.prefill_inputs(ids, 16, 2, kv, start=20, keys=32))
    whole, *kv_whole = graph(*host.prefill_inputs(ids, 16, 2, kv, start=20, keys=64))
    torch.testing.assert_close(small, whole, rtol=1e-5, atol=1e-5)
    for a, b, old in zip(kv_small, kv_whole, kv):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert torch.equal(a[:, :, 32:], old[:, :, 32:]) and torch.equal(a[[0, 1, 3]], old[[0, 1, 3]])


# -- chunked prefill at any offset, sliding rings, reused prefixes ---------------------------------


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
        logits, *kv = prefill(*host.prefill_inputs(ids[start : start + n], bucket, slot, kv, start=start))
        start += n
        seen.append((start, logits[0, : host.geo.vocab]))
    assert start == len(ids)
    return seen, kv


def test_sliding_layers_keep_a_ring_of_window_plus_a_chunk():
    *_, geo, _, _ = setup("tiny-12b")
    assert geo.ring == geo.sliding_window + geo.buckets[-1] < geo.kv_max  # 16 + 32 < 64: the tests wrap it
    spans = {shape[2] for shape in geo.kv_shapes}
    assert spans == {geo.ring, geo.kv_max}


@torch.no_grad()
@pytest.mark.parametrize("name", TINY)
def test_a_prompt_longer_than_every_bucket_matches_transformers_chunk_by_chunk(name):
    """50 tokens (the largest bucket is 32) in chunks at offsets 0, 7, 23, 43, through the ring (40
    or 48 positions) and the window, then greedy decoding to kv_max wraps the ring again."""
    folder, _, _, geo, decoder, host = setup(name)
    ref = load_reference(folder)
    prefill, decode = PrefillGraph(decoder), DecodeGraph(decoder)
    ids = _prompt(50)
    kv = [torch.zeros(s) for s in geo.kv_shapes]
    seen, kv = _prefill(prefill, host, ids, [7, 16, 20, 7], [16, 16, 32, 16], 0, kv)
    for end, logits in seen:
        want = _reference_logits(ref, ids[:end])
        assert float((softcap(logits, geo.softcap) - want).abs().max()) < CHUNK_TOL, f"after {end} tokens"
    logits, tokens = seen[-1][1], list(ids)
    while len(tokens) < geo.kv_max:
        want = _reference_logits(ref, tokens)
        assert float((softcap(logits, geo.softcap) - want).abs().max()) < CHUNK_TOL, f"at position {len(tokens)}"
        assert int(logits.argmax()) == int(want.argmax())
        tokens.append(int(logits.argmax()))
        if len(tokens) < geo.kv_max:
            logits, *kv = decode(*host.decode_inputs([tokens[-1]], [len(tokens) - 1], kv))
            logits = logits[0, : geo.vocab]


@torch.no_grad()
def test_other_slots_are_untouched_and_stale_positions_never_read():
    """A chunk into slot 2 of 4 writes only its own positions of slot 2; a slot full of an earlier
    request's garbage (huge values past the new prompt, and in every other slot) changes nothing."""
    folder, _, _, geo, decoder, host = setup("tiny-e2b", "b4")
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
    assert float((softcap(seen_dirty[-1][1], geo.softcap) - want).abs().max()) < CHUNK_TOL


@torch.no_grad()
def test_how_a_prompt_is_chunked_does_not_change_the_result():
    *_, geo, decoder, host = setup("tiny-e4b")
    prefill = PrefillGraph(decoder)
    ids = _prompt(40, seed=2)
    results = []
    for sizes, buckets in (([32, 8], [32, 16]), ([1] * 40, [16] * 40), ([16, 16, 8], [16, 16, 16])):
        seen, kv = _prefill(prefill, host, ids, sizes, buckets, 0, [torch.zeros(s) for s in geo.kv_shapes])
        results.append((seen[-1][1], kv))
    for logits, kv in results[1:]:
        torch.testing.assert_close(logits, results[0][0], rtol=1e-4, atol=1e-4)
        for a, b in zip(kv, results[0][1]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_the_chunk_graph_traces_without_scatter_or_indexing():
    *_, geo, decoder, host = setup("tiny-12b")
    kv = tuple(torch.zeros(s) for s in geo.kv_shapes)
    inputs = host.prefill_inputs([5] * 10, 16, 0, kv, start=20)
    check_traced(trace_quietly(torch.jit.trace, PrefillGraph(decoder).eval(), inputs), "prefill_16_64", geo.vocab)


@torch.no_grad()
def _prefill_all(graph, host, ids, slot, kv, start=0):
    for first, n, bucket in chunks(start, len(ids), host.geo.buckets):
        logits, *kv = graph(*host.prefill_inputs(ids[first : first + n], bucket, slot, kv, start=first))
    return logits[0, : host.geo.vocab], kv


@torch.no_grad()
@pytest.mark.parametrize("retained_len, shared", [(50, 45), (60, 27), (20, 16)])
def test_a_reused_prefix_gives_what_a_fresh_prefill_gives(retained_len, shared):
    *_, geo, decoder, host = setup("tiny-e2b", "b4")  # window 8, ring 8 + 32, kv_max 64, batch 4
    graph = PrefillGraph(decoder)
    g = torch.Generator().manual_seed(retained_len)
    old = [int(t) for t in torch.randint(8, geo.vocab, (retained_len,), generator=g)]
    new = old[:shared] + [int(t) for t in torch.randint(8, geo.vocab, (10,), generator=g)]
    assert reusable_prefix(geo, old, new) == shared
    empty = [torch.zeros(s) for s in geo.kv_shapes]
    _, kv = _prefill_all(graph, host, old, 1, empty)  # slot 1 retains `old`
    reused, _ = _prefill_all(graph, host, new, 1, kv, start=shared)
    fresh, _ = _prefill_all(graph, host, new, 1, empty)
    torch.testing.assert_close(reused, fresh, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_what_the_reuse_rule_refuses_would_read_overwritten_keys():
    """60 retained positions and a prefix of 20: the ring no longer holds keys 12..19 that the new
    tokens' windows need. Forcing the reuse anyway gives other logits: the rule is what stops it."""
    *_, geo, decoder, host = setup("tiny-e2b", "b4")  # window 8, ring 8 + 32, kv_max 64, batch 4
    graph = PrefillGraph(decoder)
    g = torch.Generator().manual_seed(7)
    old = [int(t) for t in torch.randint(8, geo.vocab, (60,), generator=g)]
    new = old[:20] + [int(t) for t in torch.randint(8, geo.vocab, (10,), generator=g)]
    assert reusable_prefix(geo, old, new) == 0
    empty = [torch.zeros(s) for s in geo.kv_shapes]
    _, kv = _prefill_all(graph, host, old, 0, empty)
    forced, _ = _prefill_all(graph, host, new, 0, kv, start=20)
    fresh, _ = _prefill_all(graph, host, new, 0, empty)
    assert float((forced - fresh).abs().max()) > 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_slot_copy_carries_the_sources_bits_in_the_kept_positions_and_nothing_else(dtype):
    """Global caches up to `keep` of the T positions the copy reads, sliding rings whole; -0.0, inf
    and NaN arrive as they were (a one-hot product would turn -0.0 into 0.0 and spread NaN)."""
    kinds = ("sliding", "sliding", "full", "full")
    shapes = [(4, 2, 24, 8)] * 2 + [(4, 1, 64, 16)] * 2  # (B, KVH, S, D): a ring of 24, kv_max 64
    kv = planted_kv(shapes, dtype)
    for source, target, keep, T in ((2, 0, 5, 16), (0, 3, 16, 16), (3, 1, 40, 64), (1, 2, 64, 64)):
        one_hot = torch.nn.functional.one_hot
        held = (torch.arange(T) < keep).to(dtype)  # (T,)
        out = copy_slot(
            one_hot(torch.tensor(source), 4).to(dtype), one_hot(torch.tensor(target), 4).to(dtype), held, kv, kinds
        )
        check_copied(kv, out, kinds, source, target, keep)
