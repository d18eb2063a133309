"""The modules ModelBuilder traces: a graph with its KV buffers as aliased module state (DeviceKV), and
the model instance that builds one rank's graph when ModelBuilder asks (RankGraph), with the
checkpoint's tensors keyed as inside it and its buffers loaded before tracing."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from contract.dtypes import DTYPES
from contract.graph_key import GraphKey
from contract.hostside import HostInputs
from contract.layout import signature
from gemma4_port.compile.nxd_plan import nxd_plan, to_nxd
from gemma4_port.compile.pipeline import DrafterBuild
from gemma4_port.compile.tracing import CompileError, example_inputs
from gemma4_port.port.decoder import Gemma4Decoder
from gemma4_port.port.drafter import Gemma4Drafter, ordered_head
from gemma4_port.port.graphs import CopyGraph, DecodeGraph, DraftGraph, PrefillGraph, VerifyGraph
from gemma4_port.port.kv import kv_shapes, ring_size
from gemma4_port.port.sharding import ModelShard, shard_drafter, shard_model
from gemma4_port.source.checkpoint_files import CheckpointReader
from gemma4_port.source.variant import Variant

GRAPHS = {"prefill": PrefillGraph, "decode": DecodeGraph, "copy": CopyGraph, "verify": VerifyGraph}
DECODER = "graph.decoder."  # where Gemma4Decoder's tensors sit inside a DeviceKV module
DRAFTER = "graph.drafter."  # and a speculative drafter's, in every weighted key's module (graph_module)


class DeviceKV(nn.Module):
    """A flat graph whose KV buffers are module state: the inputs omit them, the outputs are still
    (logits, *new_kv), and `aliases()` maps each buffer to the output holding its update, so the
    compiled graph writes it in place on the device. ModelBuilder names the state by the buffers'
    module names, "kv.0", "kv.1", ... (KV_STATE): the server reads and writes them under those."""

    def __init__(self, graph: nn.Module, shapes, dtype: torch.dtype):
        super().__init__()
        self.graph = graph
        self.kv = nn.ParameterList(nn.Parameter(torch.zeros(s, dtype=dtype), requires_grad=False) for s in shapes)

    def forward(self, *inputs):
        return self.graph(*inputs, *self.kv)

    def aliases(self) -> dict[nn.Parameter, int]:
        return {p: 1 + i for i, p in enumerate(self.kv)}  # output 0 is the logits


def graph_inputs(host: HostInputs, geo, graph: GraphKey) -> tuple[torch.Tensor, ...]:
    """A graph's example inputs without the KV tensors, which are state now."""
    return example_inputs(host, geo, graph)[: len(signature(geo, graph))]


def check_inputs(inputs, geo, graph: GraphKey) -> None:
    """Refuse example inputs that differ from the graph signature before a long compile."""
    want = signature(geo, graph)
    bad = [
        f"{n} is {tuple(t.shape)} {t.dtype}, the signature says {shape} {dtype}"
        for (n, shape, dtype), t in zip(want, inputs)
        if (tuple(t.shape), t.dtype) != (shape, dtype)
    ]
    if len(inputs) != len(want) or bad:
        raise CompileError(f"{graph}: {len(inputs)} example inputs for {len(want)} names; " + "; ".join(bad))


def empty_decoder(shard: ModelShard, dtype: torch.dtype) -> Gemma4Decoder:
    """A decoder with uninitialised storage: no random init to pay for on a 12B model."""
    with torch.device("meta"):
        decoder = Gemma4Decoder(shard, dtype)
    return decoder.to_empty(device="cpu")


@torch.no_grad()
def load_buffers(module: nn.Module, reader: CheckpointReader) -> None:
    """NxD loads parameters, not buffers, and a buffer is traced in as it is: layer_scalar (~0.06)
    must hold the checkpoint's value before tracing or every layer over-scales (and an encoder's clip
    bounds and standardize tensors theirs). `module`: a decoder, drafter or encoder (its weight_map)."""
    buffers = dict(module.named_buffers())
    for e in module.weight_map():
        if e.name in buffers:
            buffers[e.name].copy_(reader.get(e.key).to(buffers[e.name].dtype))


def full_checkpoint(
    ckpt: Path, config, dtype: torch.dtype, drafter: DrafterBuild | None = None
) -> dict[str, torch.Tensor]:
    """The whole model at `dtype` (and the whole drafter, its head in the centroid order where it has
    one), keyed as inside a DeviceKV: ModelBuilder slices it per rank."""
    reader = CheckpointReader(ckpt)
    whole_shard = shard_model(config)
    with torch.device("meta"):
        whole = Gemma4Decoder(whole_shard, dtype)
    out = {DECODER + e.name: reader.get(e.key).to(dtype).contiguous() for e in whole.weight_map()}
    if drafter is not None:
        with torch.device("meta"):
            assistant = Gemma4Drafter(shard_drafter(drafter.config, whole_shard), dtype)
        for e in assistant.weight_map():
            tensor = drafter.reader.get(e.key)
            if e.name == "lm_head.weight" and assistant.drafter.ordered:
                tensor = ordered_head(tensor, drafter.reader)
            out[DRAFTER + e.name] = tensor.to(dtype).contiguous()
    return out


def graph_module(kind: str, decoder: Gemma4Decoder, drafter: Gemma4Drafter | None) -> nn.Module:
    """A weighted key's graph. With a drafter every such key holds it (`graph.drafter`, unused but by
    the draft key): the keys share their weights by name, and ModelBuilder shards the checkpoint by
    the first key's module, which must hold every weight of the model."""
    if kind == "draft":
        assert drafter is not None  # the layout has a draft key only with a drafter
        return DraftGraph(decoder, drafter)
    graph = GRAPHS[kind](decoder)
    if drafter is not None:
        graph.drafter = drafter
    return graph


class RankGraph:
    """A ModelBuilder model instance: load_module() builds the graph of the rank that NxD's
    parallel_state names (rank 0 of the mocked setup while tracing; check_spmd made every rank's graph
    the same), its split linears as NxD layers and its buffers from the checkpoint; get() returns it
    with its KV aliases. ModelBuilder feeds the parameters from full_checkpoint, cut per rank."""

    def __init__(self, ckpt: Path, config, variant: Variant, graph: str, drafter: DrafterBuild | None = None):
        self.ckpt, self.config, self.variant, self.graph, self.drafter = ckpt, config, variant, graph, drafter

    def load_module(self) -> None:
        from neuronx_distributed.parallel_layers import parallel_state

        v, dtype = self.variant, DTYPES[self.variant.dtype]
        shard = shard_model(self.config, v.tp, parallel_state.get_tensor_model_parallel_rank())
        if self.graph == "copy":  # no weights: the decoder only tells the copy its KV tensors' kinds
            with torch.device("meta"):
                graph = CopyGraph(Gemma4Decoder(shard, dtype))
        else:
            decoder = empty_decoder(shard, dtype)
            if v.tp > 1:
                to_nxd(decoder, nxd_plan(shard), dtype)
            load_buffers(decoder, CheckpointReader(self.ckpt))
            graph = graph_module(self.graph, decoder, self.rank_drafter(shard, dtype))
        ring = ring_size(shard.sliding_window, v.kv_max, v.buckets)
        self.module = DeviceKV(graph, kv_shapes(shard, v.batch, v.kv_max, ring), dtype).eval()

    def rank_drafter(self, shard: ModelShard, dtype: torch.dtype) -> Gemma4Drafter | None:
        """This rank's drafter beside its decoder: uninitialised storage, NxD layers at tp > 1, its
        buffers from the checkpoint (NxD loads the parameters)."""
        if self.drafter is None:
            return None
        with torch.device("meta"):
            drafter = Gemma4Drafter(shard_drafter(self.drafter.config, shard), dtype)
        drafter = drafter.to_empty(device="cpu")
        if shard.tp > 1:
            to_nxd(drafter, nxd_plan(drafter.shard), dtype)
        load_buffers(drafter, self.drafter.reader)
        return drafter

    def get(self, bucket_rank: int, **_) -> tuple[DeviceKV, dict]:
        return self.module, self.module.aliases()
