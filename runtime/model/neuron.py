"""The Neuron backend: one NxD ModelBuilder model per artifact on the NeuronCores.

Every variant is built the same way (contract/layout.py): the prefill buckets and the decode
buckets are keys of one model, so each core holds one copy of its rank's weights, shared by every
bucket, and the KV buffers are the model's aliased state that never leaves the device (a fork's
copy is a key of its own). The model
is called through `nxd_model.forward(list_of_tensors)`, which routes a call to its bucket by the
input shapes: the traced top-level module only takes the arity of the last key's example (NxD
trace/spmd.py and model_builder.py build_nxd_model, tag v2.28.0). With `prefill: host` the model
is decode alone; the prompt runs through a CPU TorchScript prefill of the whole model and the host
writes its KV into the model's state, split per rank as HOST_KV says. ResidentKV is the one owner
of that state on the host side. The image and audio encoders are a second model (ENCODER_MODEL) at
tp 1 on rank 0's core. The SDK is imported only when a backend is built.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from contract.artifact import ArtifactError, ArtifactMeta
from contract.graph_key import GraphKey, prefill_graphs
from contract.layout import ENCODER_WEIGHTS, HOST_KV, KV_STATE, NXD_WEIGHTS, geometry_layout, rank_cores
from contract.versions import check_versions
from runtime.model.neuron_sdk import check_driver, installed_versions, require

log = logging.getLogger(__name__)
START_RANK = torch.tensor([0], dtype=torch.int32)  # this process drives every rank, from the first


# -- KV split between the host (whole model) and the ranks (their heads) -------------------------


def split_kv(full: list[torch.Tensor], ranges) -> list[list[torch.Tensor]]:
    """Whole-model KV tensors (B, H, K, D) -> each rank's buffers; ranges[tensor][rank] = (start, count) heads."""
    tp = len(ranges[0])
    return [[t[:, s : s + n].contiguous() for t, (s, n) in zip(full, (r[rank] for r in ranges))] for rank in range(tp)]


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


def logits_of(out) -> torch.Tensor:
    """The bucket's outputs that no state aliases: its rows (logits, then the hidden state) alone, maybe
    in a list or tuple."""
    return out if isinstance(out, torch.Tensor) else out[0]


def state_problems(state, shapes: list[tuple[int, ...]]) -> list[str]:
    """What differs between each rank's state and the artifact's KV tensors kv.0 .. kv.{n-1}. ModelBuilder
    keys the state by each INPUT_STATE tensor's checkpoint_key in the neff's metaneff (neuronx-distributed
    v2.28.0 trace/model_builder.py:987-1001), which the HLO lowering (closed source) sets: as the module's
    parameter names, by NxD's own use (spmd.py:84 finds NxD Inference's KV by ".past_key_values.", its
    KVCacheManager's ParameterList). Checked here, so another naming fails the load in one line."""
    want = {KV_STATE.format(index=i): tuple(shape) for i, shape in enumerate(shapes)}
    out = []
    for rank, held in enumerate(state):
        found = {k: tuple(v.shape) for k, v in held.items()}
        if found != want:
            missing, extra = sorted(set(want) - set(found)), sorted(set(found) - set(want))
            wrong = [k for k in set(want) & set(found) if want[k] != found[k]]
            out.append(f"rank {rank}: missing {missing}, unexpected {extra}, other shapes {sorted(wrong)}")
    return out


class ResidentKV:
    """The model's KV state on the NeuronCores, per rank: the one place that resets, reads and writes
    it (the buckets update it in place through their aliases)."""

    def __init__(self, nxd_model, shapes: list[tuple[int, ...]]):
        self.nxd_model, self.count = nxd_model, len(shapes)
        problems = state_problems(nxd_model.state, shapes)
        if problems:
            raise ArtifactError("the loaded Neuron model's KV state is not the artifact's: " + "; ".join(problems))

    @property
    def ranks(self) -> list[list[torch.Tensor]]:
        """Each rank's state tensors as they are now, read afresh: a reset builds new ones, and a
        tensor kept from before would be an orphan that no bucket reads."""
        return [[rank[KV_STATE.format(index=i)] for i in range(self.count)] for rank in self.nxd_model.state]

    def zero(self) -> None:
        # Fresh zeroed state over the weights already on the device (spmd.py initialize_with_saved_weights).
        self.nxd_model.initialize_with_saved_weights(START_RANK)

    def read(self) -> list[list[torch.Tensor]]:
        return [[t.to("cpu") for t in rank] for rank in self.ranks]

    @torch.no_grad()
    def write(self, values: list[list[torch.Tensor]]) -> None:
        for rank, rank_values in zip(self.ranks, values, strict=True):
            for dst, src in zip(rank, rank_values, strict=True):
                # In place into the device tensor: what NxD's own state writer does (neuronx-distributed
                # v2.28.0 trace/nxd_model/nxd_model.py:418, write_to_neuron_buffer, the V2 model); the
                # V1 model's state holds the same privateuseone tensors (trace/spmd.py:129).
                dst.copy_(src)


class _HostPrefill:
    """`prefill: host`: the whole model prefills on the host CPU; its KV goes into the model's state."""

    def __init__(self, folder: Path, meta: ArtifactMeta):
        module = torch.jit.load(str(folder / meta.graphs["host_prefill"]), map_location="cpu").eval()
        geo = meta.geometry
        self.graphs = {graph: getattr(module, str(graph)) for graph in prefill_graphs(geo.buckets, geo.key_buckets)}
        raw = json.loads((folder / HOST_KV).read_text())["kv_heads"]
        self.ranges = [[tuple(r) for r in per_rank] for per_rank in raw]

    def __call__(self, bucket: int, keys: int, inputs, kv: ResidentKV) -> torch.Tensor:
        # The graph replaces one slot and returns the others unchanged, so it needs the live KV.
        logits, *new = self.graphs[GraphKey.prefill(bucket, keys)](*inputs, *join_kv(kv.read(), self.ranges))
        kv.write(split_kv(new, self.ranges))
        return logits


class NeuronBackend:
    """The runner's Backend on NeuronCores: inputs come without KV, which never leaves the device
    except through a host prefill."""

    def __init__(self, folder: Path, meta: ArtifactMeta):
        check_versions(meta.versions, installed_versions())  # before anything touches a NeuronCore
        check_driver(meta.manifest["toolchain"].get("neuron_driver"))
        torch.set_grad_enabled(False)
        folder, geo = Path(folder), meta.geometry
        self.layout = geometry_layout(geo)
        self.cores = rank_cores(geo.tp)
        require("torch_neuronx", "torch-neuronx", meta.versions.get("torch-neuronx"))
        require("neuronx_distributed", "neuronx-distributed", meta.versions.get("neuronx-distributed"))
        from safetensors.torch import load_file

        # Loaded as NxD Inference loads a ModelBuilder model (its SDK 2.28 release, models/
        # application_base.py:326 and :414): a plain torch.jit.load, then initialize with the start rank;
        # rank r's state and weights go to the r-th core this process sees (NxD trace/spmd.py:129,
        # privateuseone:{rank}). torch_neuronx.neuron_cores_context is for torch_neuronx.trace models.
        self.model = torch.jit.load(str(folder / meta.graphs["model"]))
        weights = [load_file(str(folder / NXD_WEIGHTS.format(rank=r))) for r in range(geo.tp)]
        self.model.nxd_model.initialize(weights, START_RANK)  # a loaded model refuses to run before
        del weights
        log.info(
            "Neuron model loaded: %d rank(s) on NeuronCore(s) %s",
            geo.tp,
            ",".join(map(str, self.cores)) if self.cores else "from 0 (NEURON_RT_VISIBLE_CORES unset: all cores)",
        )
        self.kv = ResidentKV(self.model.nxd_model, [tuple(shape) for shape in geo.kv_shapes])
        self.host_prefill = _HostPrefill(folder, meta) if self.layout.host_prefill else None
        # The image and audio encoders: a model of their own at tp 1, no state, on rank 0's core (the
        # first this process sees), loaded as NxD Inference loads its vision model beside the text
        # model (models/image_to_text_model_base.py load_weights).
        self.encoders = None
        if self.layout.encoders:
            self.encoders = torch.jit.load(str(folder / meta.graphs["encoders"]))
            self.encoders.nxd_model.initialize([load_file(str(folder / ENCODER_WEIGHTS.format(rank=0)))], START_RANK)

    def _run(self, inputs) -> torch.Tensor:
        return logits_of(self.model.nxd_model.forward(list(inputs)))

    def prefill(self, bucket: int, keys: int, inputs) -> torch.Tensor:
        if self.host_prefill is not None:
            return self.host_prefill(bucket, keys, inputs, self.kv)
        return self._run(inputs)

    def decode(self, keys: int, inputs) -> torch.Tensor:
        return self._run(inputs)

    def copy(self, keys: int, inputs) -> None:
        self._run(inputs)  # the copy key: the KV stays on the device, with a prefill on the host too

    def encode(self, graph: GraphKey, inputs) -> torch.Tensor:
        """An encoder graph (vision_<N>, audio_<N>): the encoder model routes the inputs to the bucket of
        their shapes (the runner built them for `graph`)."""
        if self.encoders is None or graph not in self.layout.encoders:
            raise ArtifactError(f"this Neuron artifact has no {graph} graph")
        return logits_of(self.encoders.nxd_model.forward(list(inputs)))

    def verify(self, keys: int, inputs) -> torch.Tensor:
        return self._run(inputs)  # the verify key writes the slots' KV in place, as decode does

    def draft(self, keys: int, inputs) -> torch.Tensor:
        return self._run(inputs)  # the drafter reads the target's KV state where it is

    def reset(self) -> None:
        self.kv.zero()

    def close(self) -> None:
        del self.model
        self.encoders = None
