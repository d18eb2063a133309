"""`build.py compile --backend neuron`: the device graphs compiled for the NeuronCores.

Every variant goes through NxD ModelBuilder, as NxD Inference builds its models: the prefill
buckets and the decode buckets are keys of one model (decode alone when the prefill runs on the
host; a weightless `copy` key for forks beside them at batch > 1), so each core holds one copy of
its rank's weights for all of them, and the KV buffers are module state aliased to the outputs that
update them (DeviceKV), so the cache never leaves the device. ModelBuilder traces rank 0 under a
mocked distributed setup (no process group: it runs inside `docker build`; with no NeuronCore the
platform is pinned to Inferentia2 first, compile/platform.py), lowers the weights as inputs, and
shards the checkpoint into one file per rank; at tp 2 the sharding plan's split linears become NxD
parallel layers (nxd_plan).

The pure pieces are tested on the CPU, the SDK calls against a stand-in built from the SDK's source
(tests/support/neuron_sdk). The SDK is imported lazily, after `load_sdk` has named any missing
package in one line; its builds must be the manifest's exact pins, and they are recorded in
artifact.json for the loader's check (contract/versions.py).
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
from contract.graph_key import GraphKey, prefill_graphs
from contract.hostside import HostInputs
from contract.layout import HOST_KV, NXD_MODEL, NeuronLayout, neuron_layout, signature
from contract.versions import pin_problems
from gemma4_port.compile.pipeline import Build, step
from gemma4_port.compile.platform import pin_platform
from gemma4_port.compile.tracing import CompileError, example_inputs, geometry, trace_quietly
from gemma4_port.port.decoder import Gemma4Decoder
from gemma4_port.port.graphs import CopyGraph, DecodeGraph, PrefillGraph
from gemma4_port.port.kv import kv_shapes, ring_size
from gemma4_port.port.lint import check_traced
from gemma4_port.port.sharding import SPLIT, ModelShard, ShardingError, shard_model
from gemma4_port.source.checkpoint import CheckpointReader, cache_root
from gemma4_port.source.manifest import Manifest, Toolchain, Variant
from runtime.model.neuron_sdk import installed_versions, require

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


# -- the compile ---------------------------------------------------------------------------------


def load_sdk(toolchain: Toolchain) -> dict[str, str]:
    """Import the SDK or stop with one line naming the first missing package; refuse builds other
    than the manifest's pins. Returns the versions to record in artifact.json."""
    needed = [
        ("torch_neuronx", "torch-neuronx", toolchain.torch_neuronx),
        ("neuronxcc", "neuronx-cc", toolchain.neuronx_cc),
        ("neuronx_distributed", "neuronx-distributed", toolchain.neuronx_distributed),
    ]
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

    def examples(self) -> dict[str, list[tuple[torch.Tensor, ...]]]:
        """Each ModelBuilder key's bucket example inputs, checked against the signatures and linted
        on rank 0's graph (check_spmd made it every rank's; its values do not matter to the lint)."""
        decoder = empty_decoder(shard_model(self.config, self.variant.tp, 0), self.dtype)
        out = {}
        for key, graphs in self.layout.keys.items():
            module = DeviceKV(GRAPHS[key](decoder), self.geo.kv_shapes, self.dtype).eval()
            out[key] = []
            for graph in graphs:
                inputs = graph_inputs(self.host, self.geo, graph)
                check_inputs(inputs, self.geo, graph)
                check_traced(trace_quietly(torch.jit.trace, module, inputs), str(graph), self.geo.vocab)
                out[key].append(inputs)
        return out


def _model_builder(b: _Build, examples: dict[str, list[tuple]]) -> dict[str, str]:
    from neuronx_distributed.trace.model_builder import ModelBuilder

    builder = ModelBuilder(
        router=None,
        tp_degree=b.variant.tp,
        compiler_workdir=str(b.workdir),
        checkpoint_loader=partial(full_checkpoint, b.ckpt, b.config, b.dtype),
    )
    # One model, a key per graph: they share weights and KV state. ModelBuilder shards the checkpoint
    # by the first key's module (model_builder.py shard_checkpoint), so the weightless copy comes last.
    for key, inputs in examples.items():
        builder.add(
            key=key,
            model_instance=RankGraph(b.ckpt, b.config, b.variant, key),
            example_inputs=inputs,
            compiler_args=" ".join(b.compiler_args),
        )
    model = builder.trace(initialize_model_weights=False)  # no NeuronCore needed on the build host
    torch.jit.save(model, str(b.out / NXD_MODEL))  # TorchScript's save, as NxD Inference saves it
    builder.shard_checkpoint(serialize_path=str(b.out / "weights"))
    return {"model": NXD_MODEL}


def _host_prefill(b: _Build, whole: Gemma4Decoder, shards: list[ModelShard]) -> dict[str, str]:
    """CPU TorchScript prefill of the whole model, a method per chunk bucket and key bucket that holds
    it (prefill_<C>_<T>, as on the device) sharing one copy of the weights, and which KV heads each
    rank's state takes."""
    geo = geometry(b.config, whole.shard, b.variant)
    host = HostInputs(geo, b.host.tables)
    graphs = nn.Module()
    graphs.prefill = PrefillGraph(whole).eval()
    prefills = prefill_graphs(geo.buckets, geo.key_buckets)
    for graph in prefills:
        setattr(graphs, str(graph), graphs.prefill.forward)  # trace_module traces methods by name
    examples = {str(graph): example_inputs(host, geo, graph) for graph in prefills}
    traced = trace_quietly(torch.jit.trace_module, graphs, examples)
    rel = "graphs/host_prefill.pt"
    torch.jit.save(traced, str(b.out / rel))
    (b.out / HOST_KV).write_text(json.dumps({"kv_heads": kv_head_ranges(shards)}) + "\n")
    return {"host_prefill": rel}


class NeuronGraphs:
    """The variant's ModelBuilder model, compiled by neuronx-cc (and the host prefill, if any)."""

    backend = "neuron"

    def __init__(self, manifest: Manifest, variant: Variant):
        self.manifest, self.variant = manifest, variant
        self.layout = neuron_layout(variant.tp, variant.prefill, variant.buckets, variant.key_buckets, variant.batch)

    def check(self) -> dict[str, str]:
        # ModelBuilder compiles through neuron_xla_compile with its persistent cache, keyed by the HLO
        # and the flags: an unchanged graph is not compiled twice.
        os.environ.setdefault("NEURON_COMPILE_CACHE_URL", str(cache_root() / "neuron-compile-cache"))
        if self.variant.media is not None:
            raise CompileError(
                f"variant {self.variant.name!r} has media budgets: the image encoder graphs are built for the "
                "CPU backend only so far (compile it with --backend cpu, or drop `media` for a text-only Neuron build)"
            )
        pin_platform()  # before the SDK's first import: NxD reads the platform override once, then
        return load_sdk(self.manifest.toolchain)  # before any work: a missing SDK fails at once

    def graphs(self, start: Build, progress) -> dict[str, str]:
        manifest, variant, layout = self.manifest, self.variant, self.layout
        check_spmd(start.shards)
        b = _Build(
            manifest,
            variant,
            layout,
            start.ckpt,
            start.config,
            start.geo,
            HostInputs(start.geo, start.tables),
            start.out,
            cache_root() / "neuron-workdir" / f"{manifest.name}-{variant.name}",
        )
        graphs = {}
        if layout.host_prefill:
            with step(
                progress,
                f"the whole model's host prefill, "
                f"{len(prefill_graphs(start.geo.buckets, start.geo.key_buckets))} graph(s) (CPU)",
            ):
                whole = empty_decoder(shard_model(start.config), b.dtype)
                whole.load_weights(start.reader)
                graphs |= _host_prefill(b, whole, start.shards)
                del whole
        with step(progress, f"check and lint {len(layout.device_graphs)} device graph(s)"):
            examples = b.examples()
        with step(
            progress,
            f"NxD ModelBuilder: {len(layout.device_graphs)} graph(s), tp {variant.tp} "
            f"(neuronx-cc, long; workdir {b.workdir})",
        ):
            graphs |= _model_builder(b, examples)
        return graphs
