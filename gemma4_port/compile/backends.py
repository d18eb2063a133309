"""`build.py compile`: manifest -> artifact directory (graphs, host tables, tokenizer, artifact.json).

The pipeline (pipeline.py) is the same for every backend; this module picks the graph builder:
the CPU TorchScript trace here, the CPU tensor-parallel ranks (tp.py), or the NeuronCores (neuron.py)."""

from __future__ import annotations

from pathlib import Path

from contract.dtypes import DTYPES
from contract.hostside import HostInputs
from gemma4_port.compile.cpu_tp import CpuTensorParallelGraphs
from gemma4_port.compile.encoders import load_encoder
from gemma4_port.compile.neuron import NeuronGraphs
from gemma4_port.compile.pipeline import Build, run_pipeline, step
from gemma4_port.compile.tracing import load_drafter, trace_cpu
from gemma4_port.port.decoder import Gemma4Decoder
from gemma4_port.source.manifest import Manifest
from gemma4_port.source.variant import Variant


class CpuGraphs:
    """tp 1 on the CPU: the whole model in this process, traced once per bucket."""

    backend = "cpu"

    def check(self) -> dict[str, str]:
        return {}

    def graphs(self, b: Build, progress) -> dict[str, str]:
        with step(progress, "load weights (strict key map)"):
            decoder = Gemma4Decoder(b.shards[0], DTYPES[b.variant.dtype])
            decoder.load_weights(b.reader)
            drafter = load_drafter(b, 0)
        with step(progress, f"trace {len(b.geo.buckets)} prefill graph(s) + decode, lint"):
            vision = load_encoder("vision", b.vision, b.geo, b.reader)
            audio = load_encoder("audio", b.audio, b.geo, b.reader)
            host = HostInputs(b.geo, b.tables)
            return trace_cpu(decoder, host, b.geo, b.out, vision=vision, audio=audio, drafter=drafter)


def graph_builder(manifest: Manifest, variant: Variant, backend: str):
    if backend == "neuron":
        return NeuronGraphs(manifest, variant)
    return CpuGraphs() if variant.tp == 1 else CpuTensorParallelGraphs()


def compile_artifact(manifest: Manifest, variant: Variant, out: Path, backend: str = "cpu", progress=None) -> Path:
    return run_pipeline(graph_builder(manifest, variant, backend), manifest, variant, out, progress)
