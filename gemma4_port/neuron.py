"""`build.py compile --backend neuron`: the device graphs compiled for the NeuronCores.

The layout of a variant (contract/layout.py) picks the SDK call: torch_neuronx.trace per
graph at tp 1, NxD ModelBuilder (prefill buckets + decode, shared weights) at tp 2, NxD
parallel_model_trace of decode alone when the prefill runs on the host. In all three the KV buffers
are module state aliased to the outputs that update them (DeviceKV), so the cache never leaves the
device; at tp 2 the sharding plan's split linears become NxD parallel layers (nxd_plan).

The pure pieces are tested on the CPU. The SDK is imported lazily, after `load_sdk` has named any
missing package in one line; neuronx-cc must match the manifest's toolchain pins, and the versions
used are recorded in artifact.json for the loader's check (contract/versions.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from contract.artifact import Geometry
from contract.dtypes import DTYPES
from contract.hostside import HostInputs
from contract.layout import HOST_KV, NeuronLayout, neuron_layout, signature
from contract.versions import installed_versions, pin_problems, require

from .checkpoint import CheckpointReader, cache_root
from .graphs import DecodeGraph, PrefillGraph
from .lint import check_traced
from .manifest import Manifest, Toolchain, Variant
from .model import Gemma4Decoder, kv_shapes, ring_size
from .pipeline import Build, step
from .sharding import SPLIT, ModelShard, ShardingError, shard_model
from .tracing import CompileError, example_inputs, geometry, trace_quietly

GRAPHS = {"prefill": PrefillGraph, "decode": DecodeGraph}
DECODER = "graph.decoder."  # where Gemma4Decoder's tensors sit inside a DeviceKV module


class DeviceKV(nn.Module):
    """A flat graph whose KV buffers are module state: the inputs omit them, the outputs are still
    (logits, *new_kv), and `aliases()` maps each buffer to the output holding its update, so the
    compiled graph writes it in place on the device."""

    def __init__(self, graph: nn.Module, shapes, dtype: torch.dtype):
        super().__init__()
        self.graph = graph
        self.kv = nn.ParameterList(nn.Parameter(torch.zeros(s, dtype=dtype), requires_grad=False) for s in shapes)

    def forward(self, *inputs):
        return self.graph(*inputs, *self.kv)

    def aliases(self) -> dict[nn.Parameter, int]:
        return {p: 1 + i for i, p in enumerate(self.kv)}  # output 0 is the logits


def graph_of(name: str) -> tuple[str, int]:
    """"prefill_128" -> ("prefill", 128); "decode_2048" -> ("decode", 2048): prompt positions or keys."""
    graph, _, bucket = name.partition("_")
    return graph, int(bucket)


def graph_inputs(host: HostInputs, geo, name: str) -> tuple[torch.Tensor, ...]:
    """A graph's example inputs without the KV tensors, which are state now."""
    graph, bucket = graph_of(name)
    return example_inputs(host, geo, graph, bucket)[:len(signature(geo, graph, bucket))]


def check_inputs(inputs, geo, name: str) -> None:
    """Refuse example inputs that differ from the graph signature before a long compile."""
    want = signature(geo, *graph_of(name))
    bad = [f"{n} is {tuple(t.shape)} {t.dtype}, the signature says {shape} {dtype}"
           for (n, shape, dtype), t in zip(want, inputs) if (tuple(t.shape), t.dtype) != (shape, dtype)]
    if len(inputs) != len(want) or bad:
        raise CompileError(f"{name}: {len(inputs)} example inputs for {len(want)} names; " + "; ".join(bad))


# -- the sharding plan as NxD parallel layers ----------------------------------------------------

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
        out += [NxdLinear(p + "self_attn.q_proj", "column", m.hidden, q),
                NxdLinear(p + "self_attn.o_proj", "row", q, m.hidden)]
        if s.owns_cache and s.kv_rule == SPLIT:
            kv = s.kv_heads_total * s.head_dim
            out += [NxdLinear(p + f"self_attn.{n}", "column", m.hidden, kv)
                    for n in (("k_proj",) if s.k_eq_v else ("k_proj", "v_proj"))]
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


# -- modules built for the tracers ---------------------------------------------------------------

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


def to_nxd(decoder: Gemma4Decoder, plan: list[NxdLinear], dtype: torch.dtype) -> None:
    from neuronx_distributed.parallel_layers.layers import ColumnParallelLinear, RowParallelLinear

    layers = {"column": ColumnParallelLinear, "row": RowParallelLinear}
    for e in plan:
        parent, _, attr = e.path.rpartition(".")
        old = decoder.get_submodule(e.path)
        new = layers[e.kind](e.in_features, e.out_features, bias=False, dtype=dtype, **e.options)
        if new.weight.shape != old.weight.shape:
            raise ShardingError(f"{e.path}: NxD holds {tuple(new.weight.shape)} per rank, "
                                f"the sharding plan {tuple(old.weight.shape)}")
        setattr(decoder.get_submodule(parent), attr, new)


class RankGraph:
    """This rank's graph, built inside an NxD tracer that knows the rank: the rank's shard with its
    split linears as NxD layers and its KV as aliased state. parallel_model_trace calls it (pickled,
    in a process per rank); ModelBuilder calls load_module() and get()."""

    def __init__(self, ckpt: Path, config, variant: Variant, graph: str, with_weights: bool):
        self.ckpt, self.config, self.variant, self.graph, self.with_weights = ckpt, config, variant, graph, with_weights

    def load_module(self) -> None:
        from neuronx_distributed.parallel_layers import parallel_state

        v, dtype = self.variant, DTYPES[self.variant.dtype]
        shard = shard_model(self.config, v.tp, parallel_state.get_tensor_model_parallel_rank())
        decoder = empty_decoder(shard, dtype)
        to_nxd(decoder, nxd_plan(shard), dtype)
        reader = CheckpointReader(self.ckpt)
        if self.with_weights:
            decoder.load_weights(reader)  # inlined into this rank's neff: only its slices are read
        else:
            load_buffers(decoder, reader)  # ModelBuilder feeds the parameters from full_checkpoint
        ring = ring_size(shard.sliding_window, v.kv_max, v.buckets)
        self.module = DeviceKV(GRAPHS[self.graph](decoder), kv_shapes(shard, v.batch, v.kv_max, ring), dtype).eval()

    def get(self, bucket_rank: int, **_) -> tuple[DeviceKV, dict]:
        return self.module, self.module.aliases()

    def __call__(self) -> tuple[DeviceKV, dict]:
        self.load_module()
        return self.get(0)


# -- the compile ---------------------------------------------------------------------------------

def load_sdk(toolchain: Toolchain, layout: NeuronLayout) -> dict[str, str]:
    """Import what the layout needs or stop with one line naming the first missing package; refuse
    versions other than the manifest's pins. Returns the versions to record in artifact.json."""
    needed = [("torch_neuronx", "torch-neuronx", toolchain.torch_neuronx),
              ("neuronxcc", "neuronx-cc", toolchain.neuronx_cc)]
    if layout.builder != "trace":
        needed.append(("neuronx_distributed", "neuronx-distributed", toolchain.neuronx_distributed))
    for module, package, pin in needed:
        require(module, package, pin)
    installed = installed_versions(tuple(package for _, package, _ in needed))
    problems = pin_problems({package: pin for _, package, pin in needed}, installed)
    if problems:
        raise CompileError("the installed Neuron SDK is not the manifest's toolchain: " + "; ".join(problems))
    return installed


@dataclass
class _Build:
    manifest: Manifest
    variant: Variant
    layout: NeuronLayout
    ckpt: Path
    config: object  # Gemma4TextConfig
    geo: Geometry
    host: HostInputs
    out: Path
    workdir: Path

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.variant.dtype]

    @property
    def compiler_args(self) -> list[str]:
        """The manifest's neuronx-cc flags, targeting inf2 unless they say otherwise: a build host that
        is not an inf2 instance cannot be asked which chip it compiles for."""
        args = list(self.manifest.toolchain.compiler_args)
        return args if any(a.startswith("--target") for a in args) else [*args, "--target", "inf2"]

    def jobs(self, decoder: Gemma4Decoder) -> list[tuple[str, DeviceKV, tuple]]:
        """Each device graph around `decoder`, with its example inputs, checked and linted."""
        out = []
        for name in self.layout.device_graphs:
            module = DeviceKV(GRAPHS[graph_of(name)[0]](decoder), self.geo.kv_shapes, self.dtype).eval()
            inputs = graph_inputs(self.host, self.geo, name)
            check_inputs(inputs, self.geo, name)
            check_traced(trace_quietly(torch.jit.trace, module, inputs), name, self.geo.vocab)
            out.append((name, module, inputs))
        return out


def _trace(b: _Build, jobs) -> dict[str, str]:
    import torch_neuronx

    graphs = {}
    for name, module, inputs in jobs:
        # cpu_backend: the trace itself needs no NeuronCore, so any host with the RAM can build.
        traced = torch_neuronx.trace(module, inputs, input_output_aliases=module.aliases(),
                                     compiler_workdir=str(b.workdir / name), compiler_args=b.compiler_args,
                                     cpu_backend=True)
        rel = f"graphs/{name}.pt"
        torch.jit.save(traced, str(b.out / rel))
        graphs[name] = rel
    return graphs


def _model_builder(b: _Build, jobs) -> dict[str, str]:
    from neuronx_distributed.trace.model_builder import ModelBuilder

    builder = ModelBuilder(router=None, tp_degree=b.variant.tp, compiler_workdir=str(b.workdir),
                           checkpoint_loader=partial(full_checkpoint, b.ckpt, b.config, b.dtype))
    for graph in ("prefill", "decode"):  # one model, two keys: they share weights and KV state
        builder.add(key=graph, model_instance=RankGraph(b.ckpt, b.config, b.variant, graph, with_weights=False),
                    example_inputs=[inputs for name, _, inputs in jobs if graph_of(name)[0] == graph],
                    compiler_args=" ".join(b.compiler_args))
    model = builder.trace(initialize_model_weights=False)  # no NeuronCore needed on the build host
    torch.jit.save(model, str(b.out / "graphs/nxd_model.pt"))  # TorchScript's save, not an NxD one
    builder.shard_checkpoint(serialize_path=str(b.out / "weights"))
    return {"model": "graphs/nxd_model.pt"}


def _parallel_trace(b: _Build, jobs) -> dict[str, str]:
    from neuronx_distributed.trace import parallel_model_save, parallel_model_trace

    (name, _, inputs), = jobs  # one decode graph alone (the manifest refuses more with host prefill)
    model = parallel_model_trace(RankGraph(b.ckpt, b.config, b.variant, "decode", with_weights=True), inputs,
                                 tp_degree=b.variant.tp, compiler_workdir=str(b.workdir),
                                 compiler_args=b.compiler_args)
    parallel_model_save(model, str(b.out / f"graphs/{name}"))
    return {name: f"graphs/{name}"}


def _host_prefill(b: _Build, whole: Gemma4Decoder, shards: list[ModelShard]) -> dict[str, str]:
    """CPU TorchScript prefill of the whole model, and which KV heads each rank's buffers take."""
    geo = geometry(b.config, whole.shard, b.variant)
    host = HostInputs(geo, b.host.tables)
    graphs = {}
    for bucket in geo.buckets:
        traced = torch.jit.trace(PrefillGraph(whole).eval(), example_inputs(host, geo, "prefill", bucket),
                                 check_trace=False)
        graphs[f"host_prefill_{bucket}"] = rel = f"graphs/host_prefill_{bucket}.pt"
        torch.jit.save(traced, str(b.out / rel))
    (b.out / HOST_KV).write_text(json.dumps({"kv_heads": kv_head_ranges(shards)}) + "\n")
    return graphs


BUILDERS = {"trace": _trace, "model_builder": _model_builder, "parallel_trace": _parallel_trace}


class NeuronGraphs:
    """The device graphs of a variant's layout, compiled by neuronx-cc."""

    backend = "neuron"

    def __init__(self, manifest: Manifest, variant: Variant):
        self.manifest, self.variant = manifest, variant
        self.layout = neuron_layout(variant.tp, variant.prefill, variant.buckets, variant.kv_buckets)

    def check(self) -> dict[str, str]:
        # neuronx-cc keys its cache by HLO hash: an unchanged graph is not compiled twice.
        os.environ.setdefault("NEURON_COMPILE_CACHE_URL", str(cache_root() / "neuron-compile-cache"))
        return load_sdk(self.manifest.toolchain, self.layout)  # before any work: a missing SDK fails at once

    def graphs(self, start: Build, progress) -> dict[str, str]:
        manifest, variant, layout = self.manifest, self.variant, self.layout
        config, reader, shards, geo = start.config, start.reader, start.shards, start.geo
        check_spmd(shards)
        b = _Build(manifest, variant, layout, start.ckpt, config, geo, HostInputs(geo, start.tables), start.out,
                   cache_root() / "neuron-workdir" / f"{manifest.name}-{variant.name}")
        whole = None
        graphs = {}
        if variant.tp == 1 or layout.host_prefill:
            with step(progress, "load the whole model's weights (strict key map)"):
                whole = empty_decoder(shard_model(config), b.dtype)
                whole.load_weights(reader)
        if layout.host_prefill:
            with step(progress, f"trace {len(geo.buckets)} host prefill graph(s) (CPU)"):
                graphs |= _host_prefill(b, whole, shards)
        with step(progress, f"check and lint {len(layout.device_graphs)} device graph(s)"):
            # Rank 0's graph stands for every rank's (check_spmd); its values do not matter to the lint.
            jobs = b.jobs(whole if variant.tp == 1 else empty_decoder(shards[0], b.dtype))
        if variant.tp > 1:  # the NxD tracers build each rank's module themselves: drop the lint copy
            jobs = [(name, None, inputs) for name, _, inputs in jobs]
        with step(progress, f"neuronx-cc: {len(jobs)} graph(s) via {layout.builder} (long; workdir {b.workdir})"):
            graphs |= BUILDERS[layout.builder](b, jobs)
        return graphs
