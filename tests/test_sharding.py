"""The sharding plan on the real E2B / E4B / 12B configs, built on the meta device (no weights).

Each of the three kinds of "mixed heads" has its own test: kv-shared layers
agree with their owner, GQA splits whole query groups, undividable KV heads are replicated with
query groups from the original head counts."""

import dataclasses
import io

import pytest
import torch
from rich.console import Console
from transformers import Gemma4TextConfig

from gemma4_port.port.decoder import Gemma4Decoder
from gemma4_port.port.kv import kv_shapes
from gemma4_port.port.sharding import REPLICATED, SPLIT, ShardingError, shard_model, shard_table
from gemma4_port.source.configs import text_config_for
from gemma4_port.source.manifest import load_manifest
from support import MANIFESTS

REAL = ["gemma-4-e2b", "gemma-4-e4b", "gemma-4-12b"]
SPLIT_TENSORS = ("q_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module", params=REAL)
def config(request):
    return text_config_for(load_manifest(MANIFESTS / f"{request.param}.yaml"))


def real(name):
    return text_config_for(load_manifest(MANIFESTS / f"{name}.yaml"))


def meta_decoder(config, tp=1, rank=0) -> Gemma4Decoder:
    with torch.device("meta"):
        return Gemma4Decoder(shard_model(config, tp, rank))


def kv_head_read_by_each_query(s) -> list[int]:
    """The checkpoint KV head each of this rank's query heads attends with, as the model computes it."""
    return [s.kv_start + s.kv_use_start + i // s.groups for i in range(s.q_heads)]


# -- the three kinds of mixed heads ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["gemma-4-e2b", "gemma-4-e4b"])
def test_kv_shared_layers_read_their_owners_buffer_with_the_same_rule(name):
    config = real(name)
    assert config.num_kv_shared_layers > 0
    for rank in range(2):
        m = shard_model(config, 2, rank)
        shared = m.layers[m.first_shared :]
        assert len(shared) == config.num_kv_shared_layers
        for s in shared:
            owner = m.layers[m.cache_layers[s.cache]]
            assert owner.owns_cache and not s.owns_cache and owner.kind == s.kind
            assert config.kv_sharing_modes[owner.index] == "store"
            # same buffer layout: rule, heads held, first checkpoint head, head_dim
            assert (s.kv_rule, s.kv_heads, s.kv_start, s.head_dim) == (
                owner.kv_rule,
                owner.kv_heads,
                owner.kv_start,
                owner.head_dim,
            )
            assert kv_head_read_by_each_query(s) == kv_head_read_by_each_query(owner)
        decoder = meta_decoder(config, 2, rank)
        assert not hasattr(decoder.layers[m.first_shared].self_attn, "k_proj")


@pytest.mark.parametrize(
    "name, kind, nkv", [("gemma-4-e4b", "sliding", 2), ("gemma-4-e4b", "full", 2), ("gemma-4-12b", "sliding", 8)]
)
def test_gqa_splits_kv_heads_with_their_whole_query_groups(name, kind, nkv):
    config = real(name)
    nq = config.num_attention_heads
    for rank in range(2):
        layers = [s for s in shard_model(config, 2, rank).layers if s.kind == kind]
        assert layers
        for s in layers:
            assert (s.kv_rule, s.kv_heads_total, s.kv_heads, s.kv_start) == (SPLIT, nkv, nkv // 2, rank * nkv // 2)
            assert s.kv_use == s.kv_heads  # every KV head the rank holds is used by its own queries
            assert s.groups == nq // nkv  # whole query groups: the tp=1 group size
            assert sorted(set(kv_head_read_by_each_query(s))) == list(range(s.kv_start, s.kv_start + s.kv_heads))


@pytest.mark.parametrize(
    "name, kind, per_rank_groups",
    [("gemma-4-e2b", "sliding", 4), ("gemma-4-e2b", "full", 4), ("gemma-4-12b", "full", 8)],
)
def test_undividable_kv_heads_are_replicated_with_groups_from_the_original_counts(name, kind, per_rank_groups):
    config = real(name)
    for rank in range(2):
        layers = [s for s in shard_model(config, 2, rank).layers if s.kind == kind]
        assert layers
        for s in layers:
            assert (s.kv_rule, s.kv_heads_total, s.kv_heads, s.kv_start) == (REPLICATED, 1, 1, 0)
            # (original q heads / tp) / nkv; reading the already-halved q_proj width gives half this
            assert s.groups == per_rank_groups == (config.num_attention_heads // 2) // s.kv_heads_total
    if name == "gemma-4-12b":
        assert all(s.k_eq_v for s in shard_model(config, 2, 1).layers if s.kind == "full")


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_every_query_head_reads_the_kv_head_it_reads_at_tp1(config, tp):
    nq = config.num_attention_heads
    for rank in range(tp):
        for s in shard_model(config, tp, rank).layers:
            group = nq // s.kv_heads_total  # from the config: q heads per KV head in the checkpoint
            expected = [(s.q_start + i) // group for i in range(s.q_heads)]
            assert kv_head_read_by_each_query(s) == expected, (tp, rank, s.index)


def test_the_mapping_check_catches_the_seeds_halved_width_bug():
    """A known bug: groups computed from q_proj.out_features // head_dim *after* sharding q_proj."""
    config = real("gemma-4-12b")
    decoder = meta_decoder(config, 2, 1)
    s = next(layer.shard for layer in decoder.layers if layer.shard.kind == "full")
    halved_nq = decoder.layers[s.index].self_attn.q_proj.out_features // s.head_dim  # 8, not 16
    buggy = dataclasses.replace(s, groups=(halved_nq // 2) // s.kv_heads_total)
    group = config.num_attention_heads // s.kv_heads_total
    expected = [(s.q_start + i) // group for i in range(s.q_heads)]
    assert kv_head_read_by_each_query(s) == expected
    assert kv_head_read_by_each_query(buggy) != expected  # queries would read a KV head that does not exist


# -- slices and module shapes ---------------------------------------------------------------------


def _kind_of(key: str) -> str:
    return key.split(".")[-2]


def test_rank_slices_cover_each_checkpoint_tensor_exactly_once(config):
    tp = 2
    full = meta_decoder(config)
    tensors = dict(full.named_parameters()) | dict(full.named_buffers())
    full_shapes = {e.key: tuple(tensors[e.name].shape) for e in full.weight_map()}
    per_rank = [{e.key: e for e in meta_decoder(config, tp, r).weight_map()} for r in range(tp)]
    for r in range(tp):
        assert set(per_rank[r]) == set(full_shapes), "every rank maps every checkpoint tensor it needs"
    plans = [shard_model(config, tp, r) for r in range(tp)]
    for key, shape in full_shapes.items():
        entries = [per_rank[r][key] for r in range(tp)]
        kind = _kind_of(key)
        layer = int(key.split(".")[1]) if key.startswith("layers.") else None
        kv_split = kind in ("k_proj", "v_proj") and plans[0].layers[layer].kv_rule == SPLIT
        if kind in SPLIT_TENSORS or kv_split:
            assert len({e.dim for e in entries}) == 1 and entries[0].dim is not None, key
            spans = sorted((e.start, e.stop) for e in entries)
            assert spans[0][0] == 0 and spans[-1][1] == shape[entries[0].dim], key
            assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(spans, spans[1:])), f"{key}: gap or overlap {spans}"
        else:  # replicated: every rank reads the whole tensor
            for e in entries:
                assert e.dim is None or (e.start, e.stop) == (0, shape[e.dim]), key


@pytest.mark.parametrize("tp", [1, 2])
def test_each_ranks_module_shapes_are_what_the_plan_says(config, tp):
    for rank in range(tp):
        m = shard_model(config, tp, rank)
        decoder = meta_decoder(config, tp, rank)
        H = m.hidden
        for layer in decoder.layers:
            s, a = layer.shard, layer.self_attn
            assert a.q_proj.weight.shape == (s.q_heads * s.head_dim, H)
            assert a.o_proj.weight.shape == (H, s.q_heads * s.head_dim)
            if s.owns_cache:
                assert a.k_proj.weight.shape == (s.kv_heads * s.head_dim, H)
                assert (a.v_proj is None) == s.k_eq_v
                if a.v_proj is not None:
                    assert a.v_proj.weight.shape == (s.kv_heads * s.head_dim, H)
            assert layer.mlp.gate_proj.weight.shape == layer.mlp.up_proj.weight.shape == (s.intermediate, H)
            assert layer.mlp.down_proj.weight.shape == (H, s.intermediate)
            assert layer.input_layernorm.weight.shape == (H,)  # norms are never split
        tensors = dict(decoder.named_parameters()) | dict(decoder.named_buffers())
        for e in decoder.weight_map():
            if e.dim is not None:
                assert tensors[e.name].shape[e.dim] == e.stop - e.start, e.name
        assert kv_shapes(m, 2, 128, 40) == [
            (2, m.layers[i].kv_heads, 40 if m.layers[i].kind == "sliding" else 128, m.layers[i].head_dim)
            for i in m.cache_layers
            for _ in (0, 1)
        ]


def test_tp2_halves_the_split_tensors_of_the_real_models(config):
    def count(decoder):
        out = {}
        for name, t in decoder.named_parameters():
            out[name.split(".")[-2]] = out.get(name.split(".")[-2], 0) + t.numel()
        return out

    full, rank = count(meta_decoder(config)), count(meta_decoder(config, 2, 1))
    for kind in SPLIT_TENSORS:
        assert rank[kind] * 2 == full[kind], kind
    assert rank["lm_head"] == full["lm_head"]


# -- errors and the printable plan ----------------------------------------------------------------


def test_a_plan_that_cannot_hold_fails_with_a_clear_error():
    with pytest.raises(ShardingError, match="8 query heads cannot be split over tp=3"):
        shard_model(real("gemma-4-e4b"), 3, 0)
    with pytest.raises(ShardingError, match="rank 2 of tp 2"):
        shard_model(real("gemma-4-e4b"), 2, 2)
    odd = load_manifest(MANIFESTS / "tiny-e4b.yaml").model.random.config | {
        "num_attention_heads": 12,
        "num_key_value_heads": 3,
    }
    with pytest.raises(ShardingError, match="3 KV heads neither divide by tp=2 nor keep each rank's 6 query heads"):
        shard_model(Gemma4TextConfig(**odd), 2, 0)  # rank 0's 6 query heads would span 1.5 groups of 4


def _render(table) -> list[str]:
    console = Console(file=io.StringIO(), width=260, color_system=None)
    console.print(table)
    return console.file.getvalue().splitlines()


def test_shard_table_shows_each_rule_per_layer():
    lines = _render(shard_table(real("gemma-4-12b"), 2))
    rows = [line for line in lines if line.startswith("│")]
    assert len(rows) == 48
    full = [r for r in rows if " full " in r]
    assert len(full) == 8 and all("replicated (v = k)" in r and "r1: q8-15->kv0 (8 q/kv)" in r for r in full)
    sliding = [r for r in rows if " sliding " in r]
    assert all(" split " in r and "r1: q8-15->kv4-7 (2 q/kv)" in r and "4 of 8" in r for r in sliding)
    assert all("15360 -> 7680/rank" in r and "norms" in r for r in rows)

    e4b = [line for line in _render(shard_table(real("gemma-4-e4b"), 2)) if line.startswith("│")]
    assert len(e4b) == 42
    assert sum("layer 22's" in r for r in e4b) == 15 and sum("layer 23's" in r for r in e4b) == 3
    assert all("r0: q0-3->kv0, r1: q4-7->kv1 (4 q/kv)" in r for r in e4b)
