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

from contract.dtypes import DTYPES
from contract.graph_key import encoder_graphs, prefill_graphs
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
from gemma4_port.compile.nxd_encoders import build_encoders, check_routable, encoder_examples, lint_encoders
from gemma4_port.compile.nxd_plan import check_spmd, kv_head_ranges
from gemma4_port.compile.pipeline import Build, step
from gemma4_port.compile.platform import pin_platform
from gemma4_port.compile.tracing import CompileError, example_inputs, geometry, trace_quietly
from gemma4_port.port.decoder import Gemma4Decoder
from gemma4_port.port.drafter import Gemma4Drafter
from gemma4_port.port.graphs import CopyGraph, PrefillGraph
from gemma4_port.port.lint import check_traced
from gemma4_port.port.sharding import shard_drafter, shard_model
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
class NxdCompile:
    """A Build (compile/pipeline.py: checkpoint, shards, geometry, the folder) as ModelBuilder compiles
    it: its Neuron layout, the host inputs its example inputs come from, and neuronx-cc's workdir."""

    build: Build
    layout: NeuronLayout
    workdir: Path

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.build.variant.dtype]

    @property
    def host(self) -> HostInputs:
        return HostInputs(self.build.geo, self.build.tables)

    @property
    def compiler_args(self) -> list[str]:
        """The manifest's neuronx-cc flags, targeting inf2 unless they say otherwise: a build host that
        is not an inf2 instance cannot be asked which chip it compiles for."""
        args = list(self.build.manifest.toolchain.compiler_args)
        return args if any(a.startswith("--target") for a in args) else [*args, "--target", "inf2"]

    def examples(self) -> dict[str, list[tuple[torch.Tensor, ...]]]:
        """Each ModelBuilder key's bucket example inputs, checked against the signatures and linted
        on rank 0's graph (check_spmd made it every rank's; its values do not matter to the lint)."""
        b, host = self.build, self.host
        shard = shard_model(b.config, b.variant.tp, 0)
        decoder = empty_decoder(shard, self.dtype)
        drafter = None
        if b.drafter is not None:
            drafter = Gemma4Drafter(shard_drafter(b.drafter.config, shard), self.dtype)
        out = {}
        for key, graphs in self.layout.keys.items():
            graph = CopyGraph(decoder) if key == "copy" else graph_module(key, decoder, drafter)
            module = DeviceKV(graph, b.geo.kv_shapes, self.dtype).eval()
            out[key] = []
            for graph in graphs:
                inputs = graph_inputs(host, b.geo, graph)
                check_inputs(inputs, b.geo, graph)
                check_traced(trace_quietly(torch.jit.trace, module, inputs), str(graph), b.geo.vocab)
                out[key].append(inputs)
        check_routable(out, {key: [str(g) for g in graphs] for key, graphs in self.layout.keys.items()})
        return out

    def encoder_examples(self) -> dict[str, list[tuple[torch.Tensor, ...]]]:
        """The encoder model's keys' example inputs, routable and linted at their shapes."""
        b = self.build
        out = encoder_examples(b.geo, b.tables.vision_positions)
        check_routable(out, {key: [str(g) for g in graphs] for key, graphs in self.layout.encoder_keys.items()})
        lint_encoders(b, out)
        return out


def _model_builder(c: NxdCompile, examples: dict[str, list[tuple]]) -> dict[str, str]:
    from neuronx_distributed.trace.model_builder import ModelBuilder

    b = c.build
    builder = ModelBuilder(
        router=None,
        tp_degree=b.variant.tp,
        compiler_workdir=str(c.workdir),
        checkpoint_loader=partial(full_checkpoint, b.ckpt, b.config, c.dtype, b.drafter),
    )
    # One model, a key per graph: they share weights and KV state. ModelBuilder shards the checkpoint
    # by the first key's module (model_builder.py shard_checkpoint), so the weightless copy comes last.
    for key, inputs in examples.items():
        builder.add(
            key=key,
            model_instance=RankGraph(b.ckpt, b.config, b.variant, key, b.drafter),
            example_inputs=inputs,
            compiler_args=" ".join(c.compiler_args),
        )
    model = builder.trace(initialize_model_weights=False)  # no NeuronCore needed on the build host
    torch.jit.save(model, str(b.out / NXD_MODEL))  # TorchScript's save, as NxD Inference saves it
    builder.shard_checkpoint(serialize_path=str(b.out / "weights"))
    return {"model": NXD_MODEL}


def _host_prefill(b: Build, whole: Gemma4Decoder) -> dict[str, str]:
    """CPU TorchScript prefill of the whole model, a method per chunk bucket and key bucket that holds
    it (prefill_<C>_<T>, as on the device) sharing one copy of the weights, and which KV heads each
    rank's state takes."""
    geo = geometry(b.config, whole.shard, b.variant)
    host = HostInputs(geo, b.tables)
    graphs = nn.Module()
    graphs.prefill = PrefillGraph(whole).eval()
    prefills = prefill_graphs(geo.buckets, geo.key_buckets)
    for graph in prefills:
        setattr(graphs, str(graph), graphs.prefill.forward)  # trace_module traces methods by name
    examples = {str(graph): example_inputs(host, geo, graph) for graph in prefills}
    traced = trace_quietly(torch.jit.trace_module, graphs, examples)
    rel = "graphs/host_prefill.pt"
    torch.jit.save(traced, str(b.out / rel))
    (b.out / HOST_KV).write_text(json.dumps({"kv_heads": kv_head_ranges(b.shards)}) + "\n")
    return {"host_prefill": rel}


class NeuronGraphs:
    """The variant's ModelBuilder model, compiled by neuronx-cc (and the host prefill, if any, and the
    encoder model where the variant has media budgets)."""

    backend = "neuron"

    def __init__(self, manifest: Manifest, variant: Variant):
        self.manifest, self.variant = manifest, variant
        spec = manifest.speculative_for(variant)
        media = variant.media
        self.layout = neuron_layout(
            variant.tp,
            variant.prefill,
            variant.buckets,
            variant.key_buckets,
            variant.batch,
            spec.k + 1 if spec else 0,
            bool(spec and spec.has_drafter),
            encoder_graphs(
                media.image.soft_buckets if media and media.image else (),
                media.audio.soft_buckets if media and media.audio else (),
            ),
        )

    def check(self) -> dict[str, str]:
        # ModelBuilder compiles through neuron_xla_compile with its persistent cache, keyed by the HLO
        # and the flags: an unchanged graph is not compiled twice.
        os.environ.setdefault("NEURON_COMPILE_CACHE_URL", str(cache_root() / "neuron-compile-cache"))
        pin_platform()  # before the SDK's first import: NxD reads the platform override once, then
        return load_sdk(self.manifest.toolchain)  # before any work: a missing SDK fails at once

    def graphs(self, start: Build, progress) -> dict[str, str]:
        variant, layout = self.variant, self.layout
        check_spmd(start.shards)
        if start.drafter is not None:
            check_spmd([d.model for d in start.drafter.shards])
        c = NxdCompile(start, layout, compiler_workdir(self.manifest.name, variant.name))
        graphs = {}
        if layout.host_prefill:
            with step(
                progress,
                f"the whole model's host prefill, "
                f"{len(prefill_graphs(start.geo.buckets, start.geo.key_buckets))} graph(s) (CPU)",
            ):
                whole = empty_decoder(shard_model(start.config), c.dtype)
                whole.load_weights(start.reader)
                graphs |= _host_prefill(start, whole)
                del whole
        with step(progress, f"check and lint {len(layout.device_graphs) + len(layout.encoders)} device graph(s)"):
            examples = c.examples()
            encoders = c.encoder_examples() if layout.encoders else {}
        with step(
            progress,
            f"NxD ModelBuilder: {len(layout.device_graphs)} graph(s), tp {variant.tp} "
            f"(neuronx-cc, long; workdir {c.workdir})",
        ):
            graphs |= _model_builder(c, examples)
        if encoders:
            with step(progress, f"NxD ModelBuilder: {len(layout.encoders)} encoder graph(s), tp 1 (rank 0's core)"):
                graphs |= build_encoders(start, encoders, c.compiler_args, c.workdir / "encoders")
        return graphs
