"""A tiny manifest's build as compile starts it (pipeline.start_build, nothing written), for the
tests that work on the model, its inputs and its traces without compiling an artifact."""

from __future__ import annotations

import torch

from contract.hostside import HostInputs
from gemma4_port.compile.pipeline import Build, start_build
from gemma4_port.port.decoder import Gemma4Decoder
from gemma4_port.source.manifest import load_manifest

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
