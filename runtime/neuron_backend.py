"""The Neuron backend: compiled graphs on the NeuronCores, with the KV cache resident there.

Every variant has one layout, fixed by its `tp` and `prefill` (gemma4_port/neuron.py compiles it,
gemma4_port/capacity.py budgets it):
- `trace` (tp 1): one torch_neuronx.trace neff per graph (a prefill per bucket, a decode per KV bucket), each
  with its own inlined copy of the weights. The KV buffers are each graph's aliased state tensors,
  bound to the same device tensors on one core so that decode reads what prefill wrote.
- `model_builder` (tp 2, device prefill): NxD ModelBuilder compiles the prefill buckets and the decode
  buckets as one model that shares its weights and its aliased KV state; weights are per-rank safetensors.
- `parallel_trace` (tp 2, host prefill): NxD parallel_model_trace of decode alone, KV aliased.
With `prefill: host` the prompt runs through a CPU TorchScript prefill of the whole model and its
KV is written into the device buffers, split per rank as the sharding plan says (HOST_KV).
The SDK is imported only when a backend is built; the layout and the contracts below need none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from .artifact import ArtifactMeta, Geometry
from .hostside import DTYPES
from .versions import check_versions, installed_versions, require

HOST_KV = "graphs/host_kv.json"  # {"kv_heads": [[[start, count] per rank] per KV tensor]}
NXD_WEIGHTS = "weights/tp{rank}_sharded_checkpoint.safetensors"  # ModelBuilder.shard_checkpoint's names
START_RANK = torch.tensor([0], dtype=torch.int32)  # this process drives every rank, from the first


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


def variant_settings(meta: ArtifactMeta) -> dict:
    return next(v for v in meta.manifest["variants"] if v["name"] == meta.variant)


def signature(geo: Geometry, graph: str, bucket: int) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """Name, shape and dtype of each non-KV input of a graph (a prefill of `bucket` positions, a decode
    over `bucket` keys), from the geometry alone: what the host builds, what the neff was compiled
    for, and what ModelBuilder routes a call by."""
    B, S, kinds = geo.batch, bucket if graph == "prefill" else 1, len(geo.kinds)
    rows = 1 if graph == "prefill" else B
    shapes = {"hidden": (rows, S, geo.hidden), "ple": (rows, S, geo.num_layers, geo.ple_dim),
              "rope": (rows, S, sum(2 * r.head_dim for r in geo.rope.values())),
              "masks": (1, kinds, S, S), "last": (1, S), "slot": (B,), "rows": (B, kinds + 1, bucket)}
    dtype = DTYPES[geo.dtype]
    return [(n, shapes[n], dtype) for n in geo.inputs[graph] if not n.startswith("kv")]


# -- KV split between the host (whole model) and the ranks (their heads) -------------------------

def split_kv(full: list[torch.Tensor], ranges) -> list[list[torch.Tensor]]:
    """Whole-model KV tensors (B, H, K, D) -> each rank's buffers; ranges[tensor][rank] = (start, count) heads."""
    tp = len(ranges[0])
    return [[t[:, s:s + n].contiguous() for t, (s, n) in zip(full, (r[rank] for r in ranges))] for rank in range(tp)]


def join_kv(ranks: list[list[torch.Tensor]], ranges) -> list[torch.Tensor]:
    """Each rank's buffers -> whole-model KV: split heads are concatenated, replicated ones taken once."""
    out = []
    for i, per_rank in enumerate(ranges):
        if len(set(per_rank)) == 1:  # replicated: every rank holds all heads
            out.append(ranks[0][i])
        else:
            order = sorted(range(len(per_rank)), key=lambda r: per_rank[r][0])
            out.append(torch.cat([ranks[r][i] for r in order], dim=1))
    return out


# -- the aliased state tensors of a traced Neuron module -----------------------------------------

def live_states(module) -> list[torch.Tensor]:
    """A traced module's state tensors as they are now. Loading moves them to the device and
    replaces the parameters: tensors read before that are orphaned CPU copies (seed pitfall)."""
    params = dict(module.states.named_parameters())
    return [params[str(i)] for i in range(len(params))]


def bind_states(module, tensors: list[torch.Tensor]) -> None:
    """Make `module` read and update `tensors` as its state: graphs bound to the same tensors share them."""
    for i, t in enumerate(tensors):
        setattr(module.states, str(i), t)


@torch.no_grad()
def write_states(states: list[torch.Tensor], values: list[torch.Tensor]) -> None:
    for dst, src in zip(states, values, strict=True):
        dst.copy_(src)


def logits_of(out) -> torch.Tensor:
    """Aliased outputs stay on the device: a neff call returns the logits alone (maybe in a tuple)."""
    return out if isinstance(out, torch.Tensor) else out[0]


# -- the three layouts ---------------------------------------------------------------------------

class _TracedGraphs:
    """tp 1: one torch_neuronx.trace module per graph, all on the first visible core, one KV."""

    def __init__(self, folder: Path, meta: ArtifactMeta, layout: NeuronLayout):
        torch_neuronx = require("torch_neuronx", "torch-neuronx", meta.versions.get("torch-neuronx"))
        self.graphs = {n: torch.jit.load(str(folder / meta.graphs[n])) for n in layout.device_graphs}
        for g in self.graphs.values():
            torch_neuronx.move_trace_to_device(g, 0)  # default placement is round-robin over the cores
        self.states = [live_states(self.graphs[layout.device_graphs[-1]])]
        for g in self.graphs.values():
            bind_states(g, self.states[0])

    def run(self, name: str, inputs) -> torch.Tensor:
        return logits_of(self.graphs[name](*inputs))

    def reset(self) -> None:
        _zero(self.states)

    def close(self) -> None:
        self.graphs.clear()


class _ParallelDecode:
    """tp 2, host prefill: parallel_model_trace's decode, one neff per rank, KV aliased on each core."""

    def __init__(self, folder: Path, meta: ArtifactMeta, layout: NeuronLayout):
        require("neuronx_distributed", "neuronx-distributed", meta.versions.get("neuronx-distributed"))
        from neuronx_distributed.trace import parallel_model_load

        (name,) = layout.device_graphs  # one decode graph (the manifest refuses more with host prefill)
        self.model = parallel_model_load(str(folder / meta.graphs[name]))
        # The first call loads the ranks onto their cores; only then are the states device tensors.
        # An idle step (no slot writes) leaves the zero-initialised KV as it was.
        geo = meta.geometry
        self.model(*(torch.zeros(shape, dtype=dtype) for _, shape, dtype in signature(geo, "decode", geo.kv_max)))
        self.states = [live_states(m) for m in self.model.models]

    def run(self, name: str, inputs) -> torch.Tensor:
        return logits_of(self.model(*inputs))

    def reset(self) -> None:
        _zero(self.states)

    def close(self) -> None:
        del self.model


class _NxdModel:
    """tp 2, device prefill: ModelBuilder's model; it routes a call to a prefill bucket or decode by
    the input shapes, and keeps the weights and the KV state on the cores."""

    states = None  # prefill runs on the device: the host never writes the KV

    def __init__(self, folder: Path, meta: ArtifactMeta, layout: NeuronLayout):
        require("neuronx_distributed", "neuronx-distributed", meta.versions.get("neuronx-distributed"))
        from safetensors.torch import load_file

        self.model = torch.jit.load(str(folder / meta.graphs["model"]))
        weights = [load_file(str(folder / NXD_WEIGHTS.format(rank=r))) for r in range(layout.tp)]
        # A loaded model refuses to run until initialised ("This model is not initialized").
        self.model.nxd_model.initialize(weights, START_RANK)

    def run(self, name: str, inputs) -> torch.Tensor:
        return logits_of(self.model(*inputs))

    def reset(self) -> None:
        # Re-initialising from the weights already on the device builds a fresh zeroed KV state.
        self.model.nxd_model.initialize_with_saved_weights(START_RANK)

    def close(self) -> None:
        del self.model


def _zero(states: list[list[torch.Tensor]]) -> None:
    for rank in states:
        write_states(rank, [torch.zeros(t.shape, dtype=t.dtype) for t in rank])


class _HostPrefill:
    """`prefill: host`: the whole model prefills on the host CPU; its KV goes into the device buffers."""

    def __init__(self, folder: Path, meta: ArtifactMeta):
        self.graphs = {b: torch.jit.load(str(folder / meta.graphs[f"host_prefill_{b}"]), map_location="cpu").eval()
                       for b in meta.geometry.buckets}
        raw = json.loads((folder / HOST_KV).read_text())["kv_heads"]
        self.ranges = [[tuple(r) for r in per_rank] for per_rank in raw]

    def __call__(self, bucket: int, inputs, states: list[list[torch.Tensor]]) -> torch.Tensor:
        # The graph replaces one slot and returns the others unchanged, so it needs the live KV.
        old = join_kv([[t.cpu() for t in rank] for rank in states], self.ranges)
        logits, *new = self.graphs[bucket](*inputs, *old)
        for rank, values in zip(states, split_kv(new, self.ranges), strict=True):
            write_states(rank, values)
        return logits


class NeuronBackend:
    """The runner's Backend on NeuronCores: inputs come without KV, which never leaves the device
    except through a host prefill."""

    def __init__(self, folder: Path, meta: ArtifactMeta):
        check_versions(meta.versions, installed_versions())  # before anything touches a NeuronCore
        torch.set_grad_enabled(False)
        folder = Path(folder)
        geo = meta.geometry
        self.layout = neuron_layout(geo.tp, variant_settings(meta)["prefill"], geo.buckets, geo.decode_buckets)
        kind = {"trace": _TracedGraphs, "model_builder": _NxdModel, "parallel_trace": _ParallelDecode}
        self.device = kind[self.layout.builder](folder, meta, self.layout)
        self.host_prefill = _HostPrefill(folder, meta) if self.layout.host_prefill else None

    def prefill(self, bucket: int, inputs) -> torch.Tensor:
        if self.host_prefill is not None:
            return self.host_prefill(bucket, inputs, self.device.states)
        return self.device.run(f"prefill_{bucket}", inputs)

    def decode(self, keys: int, inputs) -> torch.Tensor:
        return self.device.run(f"decode_{keys}", inputs)

    def reset(self) -> None:
        self.device.reset()

    def close(self) -> None:
        self.device.close()
