"""The Neuron layout of a variant: which SDK call builds its graphs, what runs on the NeuronCores,
and each device graph's input signature. The build compiles it (gemma4_port/neuron.py), the capacity
plan budgets it, and the server loads it (runtime/model/neuron.py): one definition for the three.

- `trace` (tp 1): one torch_neuronx.trace neff per graph (a prefill per bucket, a decode per KV bucket),
  each with its own inlined copy of the weights.
- `model_builder` (tp 2, device prefill): NxD ModelBuilder compiles the prefill buckets and the decode
  buckets as one model that shares its weights and its aliased KV state.
- `parallel_trace` (tp 2, host prefill): NxD parallel_model_trace of decode alone, KV aliased; the
  prompt runs through a CPU prefill of the whole model whose KV is split per rank as HOST_KV says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from .artifact import Geometry
from .dtypes import DTYPES

HOST_KV = "graphs/host_kv.json"  # {"kv_heads": [[[start, count] per rank] per KV tensor]}
NXD_WEIGHTS = "weights/tp{rank}_sharded_checkpoint.safetensors"  # ModelBuilder.shard_checkpoint's names


@dataclass(frozen=True)
class NeuronLayout:
    builder: Literal["trace", "model_builder", "parallel_trace"]
    tp: int
    device_graphs: tuple[str, ...]  # "prefill_<bucket>" ... "decode_<keys>" ...: what runs on the NeuronCores
    host_prefill: bool

    @property
    def weight_copies(self) -> int:
        """Copies of a rank's weights on its core: a neff from torch_neuronx.trace inlines its own."""
        return len(self.device_graphs) if self.builder == "trace" else 1

    @property
    def compile_jobs(self) -> int:
        """neuronx-cc runs at once: trace compiles one graph at a time, parallel_model_trace one per
        rank, ModelBuilder every graph of the (SPMD) model in parallel."""
        return {"trace": 1, "parallel_trace": self.tp, "model_builder": len(self.device_graphs)}[self.builder]


def neuron_layout(tp: int, prefill: str, buckets: tuple[int, ...], decode_buckets: tuple[int, ...]) -> NeuronLayout:
    host = prefill == "host"
    graphs = (() if host else tuple(f"prefill_{b}" for b in buckets)) + tuple(f"decode_{t}" for t in decode_buckets)
    builder = "trace" if tp == 1 else "parallel_trace" if host else "model_builder"
    return NeuronLayout(builder, tp, graphs, host)


def signature(geo: Geometry, graph: str, bucket: int) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """Name, shape and dtype of each non-KV input of a graph (a prefill of `bucket` positions, a decode
    over `bucket` keys), from the geometry alone: what the host builds, what the neff was compiled
    for, and what ModelBuilder routes a call by."""
    B, S = geo.batch, bucket if graph == "prefill" else 1
    rows = 1 if graph == "prefill" else B
    queries = S if graph == "prefill" else B  # a mask-and-write row per chunk token, or per slot
    keys = geo.kv_max if graph == "prefill" else bucket
    shapes = {"hidden": (rows, S, geo.hidden), "ple": (rows, S, geo.num_layers, geo.ple_dim),
              "rope": (rows, S, sum(2 * r.head_dim for r in geo.rope.values())), "last": (1, S), "slot": (B,)}
    shapes |= {f"rows_{kind}": (queries, 2, min(keys, geo.span(kind))) for kind in geo.kinds}
    dtype = DTYPES[geo.dtype]
    return [(n, shapes[n], dtype) for n in geo.inputs[graph] if not n.startswith("kv")]
