"""The Neuron backend: compiled graphs on the NeuronCores, with the KV cache resident there.

The variant's layout (contract/layout.py) says which of the three loaders below applies. In each,
the KV buffers are the graphs' aliased state tensors and this backend their one owner: bound to
the same device tensors so that decode reads what prefill wrote, zeroed by `reset`, and written
from the host only by a host prefill, split per rank as HOST_KV says.
The SDK is imported only when a backend is built.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from contract.artifact import ArtifactMeta
from contract.layout import HOST_KV, NXD_WEIGHTS, NeuronLayout, neuron_layout, signature
from contract.versions import check_versions, installed_versions, require

START_RANK = torch.tensor([0], dtype=torch.int32)  # this process drives every rank, from the first


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
    replaces the parameters: tensors read before that are orphaned CPU copies."""
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


class ResidentKV:
    """The KV state tensors on the NeuronCores, per rank: the one place that zeroes, reads and writes
    them (the graphs update them in place through their aliases)."""

    def __init__(self, ranks: list[list[torch.Tensor]]):
        self.ranks = ranks

    def zero(self) -> None:
        for rank in self.ranks:
            write_states(rank, [torch.zeros(t.shape, dtype=t.dtype) for t in rank])

    def read(self) -> list[list[torch.Tensor]]:
        return [[t.cpu() for t in rank] for rank in self.ranks]

    def write(self, values: list[list[torch.Tensor]]) -> None:
        for rank, v in zip(self.ranks, values, strict=True):
            write_states(rank, v)


# -- the three layouts ---------------------------------------------------------------------------

class _TracedGraphs:
    """tp 1: one torch_neuronx.trace module per graph, all on the first visible core, one KV."""

    def __init__(self, folder: Path, meta: ArtifactMeta, layout: NeuronLayout):
        torch_neuronx = require("torch_neuronx", "torch-neuronx", meta.versions.get("torch-neuronx"))
        self.graphs = {n: torch.jit.load(str(folder / meta.graphs[n])) for n in layout.device_graphs}
        for g in self.graphs.values():
            torch_neuronx.move_trace_to_device(g, 0)  # default placement is round-robin over the cores
        self.kv = ResidentKV([live_states(self.graphs[layout.device_graphs[-1]])])
        for g in self.graphs.values():
            bind_states(g, self.kv.ranks[0])

    def run(self, name: str, inputs) -> torch.Tensor:
        return logits_of(self.graphs[name](*inputs))

    def reset(self) -> None:
        self.kv.zero()

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
        self.kv = ResidentKV([live_states(m) for m in self.model.models])

    def run(self, name: str, inputs) -> torch.Tensor:
        return logits_of(self.model(*inputs))

    def reset(self) -> None:
        self.kv.zero()

    def close(self) -> None:
        del self.model


class _NxdModel:
    """tp 2, device prefill: ModelBuilder's model; it routes a call to a prefill bucket or decode by
    the input shapes, and keeps the weights and the KV state on the cores."""

    kv = None  # prefill runs on the device: the host never writes the KV; reset re-initialises it

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


class _HostPrefill:
    """`prefill: host`: the whole model prefills on the host CPU; its KV goes into the device buffers."""

    def __init__(self, folder: Path, meta: ArtifactMeta):
        self.graphs = {b: torch.jit.load(str(folder / meta.graphs[f"host_prefill_{b}"]), map_location="cpu").eval()
                       for b in meta.geometry.buckets}
        raw = json.loads((folder / HOST_KV).read_text())["kv_heads"]
        self.ranges = [[tuple(r) for r in per_rank] for per_rank in raw]

    def __call__(self, bucket: int, inputs, kv: ResidentKV) -> torch.Tensor:
        # The graph replaces one slot and returns the others unchanged, so it needs the live KV.
        logits, *new = self.graphs[bucket](*inputs, *join_kv(kv.read(), self.ranges))
        kv.write(split_kv(new, self.ranges))
        return logits


class NeuronBackend:
    """The runner's Backend on NeuronCores: inputs come without KV, which never leaves the device
    except through a host prefill."""

    def __init__(self, folder: Path, meta: ArtifactMeta):
        check_versions(meta.versions, installed_versions())  # before anything touches a NeuronCore
        torch.set_grad_enabled(False)
        folder = Path(folder)
        geo = meta.geometry
        self.layout = neuron_layout(geo.tp, geo.prefill, geo.buckets, geo.decode_buckets)
        kind = {"trace": _TracedGraphs, "model_builder": _NxdModel, "parallel_trace": _ParallelDecode}
        self.device = kind[self.layout.builder](folder, meta, self.layout)
        self.host_prefill = _HostPrefill(folder, meta) if self.layout.host_prefill else None

    def prefill(self, bucket: int, inputs) -> torch.Tensor:
        if self.host_prefill is not None:
            return self.host_prefill(bucket, inputs, self.device.kv)
        return self.device.run(f"prefill_{bucket}", inputs)

    def decode(self, keys: int, inputs) -> torch.Tensor:
        return self.device.run(f"decode_{keys}", inputs)

    def reset(self) -> None:
        self.device.reset()

    def close(self) -> None:
        self.device.close()
