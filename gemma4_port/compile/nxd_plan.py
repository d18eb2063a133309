"""The sharding plan (port/sharding.py) as NxD parallel layers, for ModelBuilder: which linears become
ColumnParallelLinear or RowParallelLinear, the slice NxD's checkpoint sharder gives each rank (checked
against the plan's, which the CPU path reads), that every rank traces one graph (SPMD), and which KV
heads each rank's state holds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from gemma4_port.port.decoder import Gemma4Decoder
from gemma4_port.port.sharding import SPLIT, ModelShard, ShardingError


@dataclass(frozen=True)
class NxdLinear:
    """One linear the sharding plan splits, as the NxD layer that holds it. Sizes are global."""

    path: str  # module path inside Gemma4Decoder
    kind: Literal["column", "row"]
    in_features: int
    out_features: int

    @property
    def options(self) -> dict:
        # Column outputs stay split for the per-head attention and the MLP product; a row layer
        # takes the split input and all-reduces its partial sums itself.
        return {"gather_output": False} if self.kind == "column" else {"input_is_parallel": True}

    @property
    def partition_dim(self) -> int:
        return 0 if self.kind == "column" else 1  # of the (out, in) weight

    def local_shape(self, tp: int) -> tuple[int, int]:
        if self.kind == "column":
            return self.out_features // tp, self.in_features
        return self.out_features, self.in_features // tp

    def rank_slice(self, tp: int, rank: int) -> tuple[int, int, int]:
        """(dim, start, stop) that NxD's checkpoint sharder gives `rank`: chunk `rank` of `tp`."""
        size = self.local_shape(tp)[self.partition_dim]
        return self.partition_dim, rank * size, (rank + 1) * size


def nxd_plan(m: ModelShard) -> list[NxdLinear]:
    """Every tensor the plan splits, as an NxD parallel linear. Everything else (norms, PLE, lm_head,
    and K/V whose heads do not divide, which the plan replicates) stays a plain module on each rank."""
    out = []
    for s in m.layers:
        p = f"layers.{s.index}."
        q = s.q_heads_total * s.head_dim
        out += [
            NxdLinear(p + "self_attn.q_proj", "column", m.hidden, q),
            NxdLinear(p + "self_attn.o_proj", "row", q, m.hidden),
        ]
        if s.owns_cache and s.kv_rule == SPLIT:
            kv = s.kv_heads_total * s.head_dim
            out += [
                NxdLinear(p + f"self_attn.{n}", "column", m.hidden, kv)
                for n in (("k_proj",) if s.k_eq_v else ("k_proj", "v_proj"))
            ]
        out += [NxdLinear(p + f"mlp.{n}", "column", m.hidden, s.intermediate_total) for n in ("gate_proj", "up_proj")]
        out.append(NxdLinear(p + "mlp.down_proj", "row", s.intermediate_total, m.hidden))
    return out


def check_spmd(shards: list[ModelShard]) -> None:
    """ModelBuilder traces one rank's graph and runs it on all: ranks may differ in which slices they
    hold, never in shapes or in which buffer heads their queries read."""

    def graph(m):
        return [(s.q_heads, s.kv_heads, s.kv_use_start, s.kv_use, s.groups, s.intermediate) for s in m.layers]

    for m in shards[1:]:
        if graph(m) != graph(shards[0]):
            raise ShardingError(f"rank {m.rank} of tp {m.tp} needs another graph than rank 0: not SPMD")


def kv_head_ranges(shards: list[ModelShard]) -> list[list[tuple[int, int]]]:
    """[KV tensor][rank] -> (first head, heads) of the whole model's buffer that the rank holds."""
    out = []
    for layer in shards[0].cache_layers:
        per_rank = [(m.layers[layer].kv_start, m.layers[layer].kv_heads) for m in shards]
        out += [per_rank, per_rank]  # K, then V
    return out


def to_nxd(decoder: Gemma4Decoder, plan: list[NxdLinear], dtype: torch.dtype) -> None:
    from neuronx_distributed.parallel_layers.layers import ColumnParallelLinear, RowParallelLinear

    layers = {"column": ColumnParallelLinear, "row": RowParallelLinear}
    # NxD shards the whole checkpoint itself: its slice must be the one the plan (and the CPU path) reads.
    planned = {w.name: (w.dim, w.start, w.stop) for w in decoder.weight_map()}
    tp, rank = decoder.shard.tp, decoder.shard.rank
    for e in plan:
        parent, _, attr = e.path.rpartition(".")
        old = decoder.get_submodule(e.path)
        new = layers[e.kind](e.in_features, e.out_features, bias=False, dtype=dtype, **e.options)
        if new.weight.shape != old.weight.shape:
            raise ShardingError(
                f"{e.path}: NxD holds {tuple(new.weight.shape)} per rank, the sharding plan {tuple(old.weight.shape)}"
            )
        if planned[e.path + ".weight"] != e.rank_slice(tp, rank):
            raise ShardingError(
                f"{e.path}: NxD gives rank {rank} the slice (dim, start, stop) {e.rank_slice(tp, rank)}, "
                f"the sharding plan {planned[e.path + '.weight']}"
            )
        setattr(decoder.get_submodule(parent), attr, new)
