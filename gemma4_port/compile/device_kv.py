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
from gemma4_port.compile.tracing import CompileError, example_inputs
from gemma4_port.port.decoder import Gemma4Decoder
from gemma4_port.port.graphs import CopyGraph, DecodeGraph, PrefillGraph
from gemma4_port.port.kv import kv_shapes, ring_size
from gemma4_port.port.sharding import ModelShard, shard_model
from gemma4_port.source.checkpoint import CheckpointReader
from gemma4_port.source.manifest import Variant

GRAPHS = {"prefill": PrefillGraph, "decode": DecodeGraph, "copy": CopyGraph}
DECODER = "graph.decoder."  # where Gemma4Decoder's tensors sit inside a DeviceKV module


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
def load_buffers(decoder: Gemma4Decoder, reader: CheckpointReader) -> None:
    """NxD loads parameters, not buffers, and a buffer is traced in as it is: layer_scalar (~0.06)
    must hold the checkpoint's value before tracing or every layer over-scales."""
    buffers = dict(decoder.named_buffers())
    for e in decoder.weight_map():
        if e.name in buffers:
            buffers[e.name].copy_(reader.get(e.key).to(buffers[e.name].dtype))


def full_checkpoint(ckpt: Path, config, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The whole model at `dtype`, keyed as inside a DeviceKV: ModelBuilder slices it per rank."""
    reader = CheckpointReader(ckpt)
    with torch.device("meta"):
        whole = Gemma4Decoder(shard_model(config), dtype)
    return {DECODER + e.name: reader.get(e.key).to(dtype).contiguous() for e in whole.weight_map()}


class RankGraph:
    """A ModelBuilder model instance: load_module() builds the graph of the rank that NxD's
    parallel_state names (rank 0 of the mocked setup while tracing; check_spmd made every rank's graph
    the same), its split linears as NxD layers and its buffers from the checkpoint; get() returns it
    with its KV aliases. ModelBuilder feeds the parameters from full_checkpoint, cut per rank."""

    def __init__(self, ckpt: Path, config, variant: Variant, graph: str):
        self.ckpt, self.config, self.variant, self.graph = ckpt, config, variant, graph

    def load_module(self) -> None:
        from neuronx_distributed.parallel_layers import parallel_state

        v, dtype = self.variant, DTYPES[self.variant.dtype]
        shard = shard_model(self.config, v.tp, parallel_state.get_tensor_model_parallel_rank())
        if self.graph == "copy":  # no weights: the decoder only tells the copy its KV tensors' kinds
            with torch.device("meta"):
                decoder = Gemma4Decoder(shard, dtype)
        else:
            decoder = empty_decoder(shard, dtype)
            if v.tp > 1:
                to_nxd(decoder, nxd_plan(shard), dtype)
            load_buffers(decoder, CheckpointReader(self.ckpt))
        ring = ring_size(shard.sliding_window, v.kv_max, v.buckets)
        self.module = DeviceKV(GRAPHS[self.graph](decoder), kv_shapes(shard, v.batch, v.kv_max, ring), dtype).eval()

    def get(self, bucket_rank: int, **_) -> tuple[DeviceKV, dict]:
        return self.module, self.module.aliases()
