"""A tiny manifest's build as compile starts it (pipeline.start_build, nothing written), for the
tests that work on the model, its inputs and its traces without compiling an artifact; and a
runner over its untraced graphs (eager_runner)."""

from __future__ import annotations

import torch

from contract.hostside import DRAFT_ORDERING, HostInputs
from gemma4_port.compile.pipeline import Build, start_build
from gemma4_port.compile.tracing import load_drafter
from gemma4_port.port.decoder import Gemma4Decoder
from gemma4_port.port.graphs import CopyGraph, DecodeGraph, DraftGraph, PrefillGraph, VerifyGraph
from gemma4_port.source.manifest import load_manifest
from runtime.model.runner import ModelRunner

from . import MANIFESTS


def started(name: str, variant: str = "fp32") -> Build:
    manifest = load_manifest(MANIFESTS / f"{name}.yaml")
    return start_build(manifest, manifest.variant(variant))


def setup(name: str, variant: str = "fp32"):
    """(checkpoint folder, config, rank 0's shard, geometry, its float32 decoder with the checkpoint's
    weights, host inputs)."""
    b = started(name, variant)
    decoder = Gemma4Decoder(b.shards[0], torch.float32)
    decoder.load_weights(b.reader)
    return b.ckpt, b.config, b.shards[0], b.geo, decoder, HostInputs(b.geo, b.tables)


class EagerBackend:
    """The runner's Backend over the untraced graph modules in this process (any key bucket: an eager
    module takes every shape): what the traced graphs compute, without a compile."""

    def __init__(self, b: Build, decoder: Gemma4Decoder, drafter):
        self.graphs = {
            "prefill": PrefillGraph(decoder),
            "decode": DecodeGraph(decoder),
            "copy": CopyGraph(decoder),
            "verify": VerifyGraph(decoder),
        }
        if drafter is not None:
            self.graphs["draft"] = DraftGraph(decoder, drafter)
        self.shapes = b.geo.kv_shapes
        self.reset()

    @torch.no_grad()
    def _run(self, kind: str, inputs) -> torch.Tensor:
        rows, *self.kv = self.graphs[kind](*inputs, *self.kv)
        return rows

    def prefill(self, bucket, keys, inputs):
        return self._run("prefill", inputs)

    def decode(self, keys, inputs):
        return self._run("decode", inputs)

    def copy(self, keys, inputs):
        self._run("copy", inputs)

    def verify(self, keys, inputs):
        return self._run("verify", inputs)

    def draft(self, keys, inputs):
        return self._run("draft", inputs)

    def reset(self):
        self.kv = [torch.zeros(s) for s in self.shapes]

    def close(self):
        pass


@torch.no_grad()
def eager_runner(name: str, variant: str) -> tuple[ModelRunner, Build]:
    """A float32 ModelRunner of a tiny manifest's variant over EagerBackend (with its drafter, if any)."""
    b = started(name, variant)
    decoder = Gemma4Decoder(b.shards[0], torch.float32)
    decoder.load_weights(b.reader)
    drafter = load_drafter(b, 0)
    order = b.tables.blobs.get(DRAFT_ORDERING)
    runner = ModelRunner(
        b.geo,
        HostInputs(b.geo, b.tables),
        EagerBackend(b, decoder, drafter),
        draft_order=None if order is None else order.argsort(),
    )
    return runner, b
