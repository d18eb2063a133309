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

import torch
from torch import nn

from contract.artifact import Geometry
from contract.dtypes import DTYPES
from contract.graph_key import prefill_graphs
from contract.hostside import HostInputs
from contract.layout import HOST_KV, NXD_MODEL, NeuronLayout, neuron_layout
from contract.versions import pin_problems
from gemma4_port.compile.device_kv import (
    DeviceKV,
    RankGraph,
    check_inputs,
    empty_decoder,
    full_checkpoint,
    graph_inputs,
    graph_module,
)
from gemma4_port.compile.nxd_plan import check_spmd, kv_head_ranges
from gemma4_port.compile.pipeline import Build, DrafterBuild, step
from gemma4_port.compile.platform import pin_platform
from gemma4_port.compile.tracing import CompileError, example_inputs, geometry, trace_quietly
from gemma4_port.port.decoder import Gemma4Decoder
from gemma4_port.port.drafter import Gemma4Drafter
from gemma4_port.port.graphs import CopyGraph, PrefillGraph
from gemma4_port.port.lint import check_traced
from gemma4_port.port.sharding import ModelShard, shard_drafter, shard_model
from gemma4_port.source.checkpoint import cache_root
from gemma4_port.source.manifest import Manifest
from gemma4_port.source.toolchain import Toolchain
from gemma4_port.source.variant import Variant
from runtime.model.neuron_sdk import installed_versions, require


def compiler_workdir(manifest: str, variant: str) -> Path:
    """Where neuronx-cc writes a variant's HLO, neffs and logs (doctor copies the logs from here)."""
    return cache_root() / "neuron-workdir" / f"{manifest}-{variant}"


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
    drafter: DrafterBuild | None = None

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
        shard = shard_model(self.config, self.variant.tp, 0)
        decoder = empty_decoder(shard, self.dtype)
        drafter = None
        if self.drafter is not None:
            drafter = Gemma4Drafter(shard_drafter(self.drafter.config, shard), self.dtype)
        out = {}
        for key, graphs in self.layout.keys.items():
            graph = CopyGraph(decoder) if key == "copy" else graph_module(key, decoder, drafter)
            module = DeviceKV(graph, self.geo.kv_shapes, self.dtype).eval()
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
        checkpoint_loader=partial(full_checkpoint, b.ckpt, b.config, b.dtype, b.drafter),
    )
    # One model, a key per graph: they share weights and KV state. ModelBuilder shards the checkpoint
    # by the first key's module (model_builder.py shard_checkpoint), so the weightless copy comes last.
    for key, inputs in examples.items():
        builder.add(
            key=key,
            model_instance=RankGraph(b.ckpt, b.config, b.variant, key, b.drafter),
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
        spec = manifest.speculative_for(variant)
        self.layout = neuron_layout(
            variant.tp,
            variant.prefill,
            variant.buckets,
            variant.key_buckets,
            variant.batch,
            spec.k + 1 if spec else 0,
            bool(spec and spec.has_drafter),
        )

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
        if start.drafter is not None:
            check_spmd([d.model for d in start.drafter.shards])
        b = _Build(
            manifest,
            variant,
            layout,
            start.ckpt,
            start.config,
            start.geo,
            HostInputs(start.geo, start.tables),
            start.out,
            compiler_workdir(manifest.name, variant.name),
            start.drafter,
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
