"""The device graph (eager, before tracing) against transformers, and its strict weight loading."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from contract.greedy import softcap
from contract.hostside import HostInputs
from gemma4_port.checkpoint import CheckpointReader, read_text_config, resolve_checkpoint
from gemma4_port.graphs import DecodeGraph, PrefillGraph
from gemma4_port.manifest import load_manifest
from gemma4_port.model import Gemma4Decoder, WeightError
from gemma4_port.reference import load_reference, reference_greedy
from gemma4_port.sharding import shard_model
from gemma4_port.tracing import EXAMPLE_TOKEN, example_inputs, geometry, host_tables

ROOT = Path(__file__).resolve().parents[1]
TINY = ["tiny-e2b", "tiny-e4b", "tiny-12b"]


def _setup(name, variant="fp32"):
    manifest = load_manifest(ROOT / f"manifests/{name}.yaml")
    folder = resolve_checkpoint(manifest)
    config = read_text_config(folder)
    reader = CheckpointReader(folder)
    shard = shard_model(config)
    geo = geometry(config, shard, manifest.variant(variant))
    decoder = Gemma4Decoder(shard, torch.float32)
    decoder.load_weights(reader)
    return folder, config, shard, geo, decoder, HostInputs(geo, host_tables(reader, geo))


@torch.no_grad()
@pytest.mark.parametrize("name", TINY)
def test_prefill_and_decode_match_transformers(name):
    folder, config, shard, geo, decoder, host = _setup(name)
    prefill, decode = PrefillGraph(decoder), DecodeGraph(decoder)
    ids = [2, 17, 300, 41, 999, 5, 77, 123, 640, 12, 9]  # 11 tokens: crosses the sliding window of 8
    steps = 20  # decode past the window too
    ref_tokens, ref_logits = reference_greedy(load_reference(folder), ids, steps)
    kv = [torch.zeros(s) for s in geo.kv_shapes]
    logits, *kv = prefill(*host.prefill(ids, 16, 0, kv))
    got = []
    for i in range(steps):
        assert float((softcap(logits[0], geo.softcap) - ref_logits[i]).abs().max()) < 2e-3, f"step {i}"
        got.append(int(logits[0].argmax()))
        logits, *kv = decode(*host.decode([got[-1]], [len(ids) + i], kv))
    assert got == ref_tokens


def test_kv_buffers_only_for_layers_that_own_a_cache():
    _, config, shard, geo, decoder, _ = _setup("tiny-e2b")
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
    _, _, shard, _, decoder, _ = _setup("tiny-12b")
    full = [layer for layer in decoder.layers if layer.shard.kind == "full"]
    assert full and all(layer.self_attn.v_proj is None for layer in full)
    assert all(layer.shard.kv_heads == 1 for layer in full)


@pytest.mark.parametrize("drop", ["layers.2.layer_scalar", "layers.0.self_attn.k_norm.weight", "norm.weight"])
def test_a_missing_checkpoint_tensor_fails_by_name(tmp_path, drop):
    folder, config, shard, *_ = _setup("tiny-e2b")
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["model.language_model." + drop]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(Exception, match=f"no tensor '{drop}'"):
        Gemma4Decoder(shard).load_weights(CheckpointReader(tmp_path))


def test_a_wrong_shape_fails_by_name(tmp_path):
    folder, config, shard, *_ = _setup("tiny-e2b")
    tensors = load_file(str(folder / "model.safetensors"))
    key = "model.language_model.layers.1.mlp.up_proj.weight"
    tensors[key] = tensors[key][:-1]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(WeightError, match="layers.1.mlp.up_proj.weight"):
        Gemma4Decoder(shard).load_weights(CheckpointReader(tmp_path))


def test_every_module_tensor_is_mapped_and_layer_scalar_is_loaded():
    *_, decoder, _ = _setup("tiny-e4b")
    names = {e.name for e in decoder.weight_map()}
    assert names == set(dict(decoder.named_parameters())) | set(dict(decoder.named_buffers()))
    scalars = torch.stack([layer.layer_scalar for layer in decoder.layers])
    assert not torch.isnan(scalars).any() and float((scalars - 1).abs().min()) > 0.4


def test_graph_signatures_match_the_host_inputs():
    _, _, shard, geo, decoder, host = _setup("tiny-e2b", "b4")
    pre = example_inputs(host, geo, "prefill", 16)
    assert geo.decode_buckets == (32, 64)
    dec = example_inputs(host, geo, "decode", 32)
    assert len(pre) == len(geo.inputs["prefill"]) and len(dec) == len(geo.inputs["decode"])
    named = dict(zip(geo.inputs["decode"], dec))
    assert named["hidden"].shape == (4, 1, geo.hidden)
    assert named["ple"].shape == (4, 1, geo.num_layers, geo.ple_dim)
    assert named["rope"].shape == (4, 1, sum(2 * r.head_dim for r in geo.rope.values()))
    assert named["rows_full"].shape == (4, 2, 32)  # a mask row, then the write, over the first 32 keys
    assert named["rows_sliding"].shape == (4, 2, 32)  # the ring (40) read up to the bucket too
    assert named["kv0_k"].shape == geo.kv_shapes[0]  # the graph still takes (and returns) whole buffers
    named = dict(zip(geo.inputs["prefill"], pre))
    assert named["slot"].shape == (4,) and named["rows_full"].shape == (16, 2, geo.kv_max)
    assert named["rows_sliding"].shape == (16, 2, geo.ring)


def test_a_tp_rank_traces_from_the_rows_its_example_inputs_look_up():
    folder, _, _, geo, _, host = _setup("tiny-e2b", "b4")
    few = HostInputs(geo, host_tables(CheckpointReader(folder), geo, rows=EXAMPLE_TOKEN + 1))
    assert few.tables.embed.shape == (EXAMPLE_TOKEN + 1, geo.hidden)
    for graph, bucket in (("prefill", 16), ("decode", 32)):
        for a, b in zip(example_inputs(few, geo, graph, bucket), example_inputs(host, geo, graph, bucket)):
            assert torch.equal(a, b)


@torch.no_grad()
def test_a_decode_bucket_computes_what_the_whole_cache_does():
    """Below the bucket's T keys, attending over T and rewriting only them gives the same logits and
    the same whole buffers as the kv_max graph (the tail comes back untouched)."""
    *_, geo, decoder, host = _setup("tiny-e2b", "b4")
    graph = DecodeGraph(decoder)
    g = torch.Generator().manual_seed(0)
    kv = [torch.randn(s, generator=g) for s in geo.kv_shapes]  # a used cache: every position non-zero
    tokens, positions = [5, None, 700, 31], [3, 0, 31, 17]
    small, *kv_small = graph(*host.decode(tokens, positions, kv, keys=32))
    whole, *kv_whole = graph(*host.decode(tokens, positions, kv, keys=64))
    busy = [0, 2, 3]
    torch.testing.assert_close(small[busy], whole[busy], rtol=1e-5, atol=1e-5)
    for a, b, old in zip(kv_small, kv_whole, kv):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert torch.equal(a[:, :, 32:], old[:, :, 32:])
    with pytest.raises(ValueError, match="decode buckets"):
        host.decode(tokens, positions, kv, keys=48)


def test_decode_inputs_are_the_rows_of_their_definition():
    """The precomputed tables give, per slot, exactly the causal/windowed mask over its kind's cache
    (a sliding ring key j holds position q - ((q - j) mod ring)), the one-hot write and the rotary
    rows of its position; an idle slot writes nothing and sees no key."""
    *_, geo, _, host = _setup("tiny-e2b", "b4")
    K, W = geo.kv_max, geo.sliding_window
    positions = [0, W, K - 1, 5]
    named = dict(zip(geo.inputs["decode"], host.decode([7, 8, 9, None], positions)))
    rope = named["rope"]
    for slot, p in enumerate(positions[:3]):
        start = 0
        for kind in geo.kinds:
            S, rows = geo.span(kind), named[f"rows_{kind}"]
            keys = torch.arange(S)
            held = p - (p - keys) % S
            visible = (held >= 0) & ((held > p - W) if kind == "sliding" else True)
            assert torch.equal(rows[slot, 0] == 0, visible), (kind, p)
            assert torch.equal(rows[slot, 1], (keys == p % S).to(host.dtype))
            inv = torch.tensor(geo.rope[kind].inv_freq)
            angles = torch.cat((p * inv, p * inv))
            d = geo.rope[kind].head_dim
            assert torch.equal(rope[slot, 0, start:start + d], angles.cos().to(host.dtype))
            assert torch.equal(rope[slot, 0, start + d:start + 2 * d], angles.sin().to(host.dtype))
            start += 2 * d
    for kind in geo.kinds:
        rows = named[f"rows_{kind}"]
        assert not rows[3, 1].any() and not (rows[3, 0] == 0).any()
    assert all(t.is_contiguous() for t in named.values())
