"""The image and audio encoders as every compile path builds them: the encoder of a kind with the
checkpoint's weights, and each encoder graph's example inputs (its values do not matter, its shapes
do), made by the builders the server uses (contract/media_inputs.py)."""

from __future__ import annotations

import torch

from contract.artifact import Geometry
from contract.dtypes import DTYPES
from contract.graph_key import GraphKey
from contract.media_inputs import AudioInputs, VisionInputs
from gemma4_port.port.audio import AudioEncoder
from gemma4_port.port.vision import VisionEncoder
from gemma4_port.source.checkpoint_files import CheckpointReader

ENCODERS = {"vision": VisionEncoder, "audio": AudioEncoder}


def load_encoder(kind: str, config, geo: Geometry, reader: CheckpointReader) -> VisionEncoder | AudioEncoder | None:
    """The `kind` encoder (config: its Gemma4VisionConfig / Gemma4AudioConfig, or None) with the
    checkpoint's weights."""
    if config is None:
        return None
    encoder = ENCODERS[kind](config, geo.hidden, DTYPES[geo.dtype])
    encoder.load_weights(reader)
    return encoder


def example_audio(soft_tokens: int, mel: int = 128) -> dict[str, torch.Tensor]:
    """A feature extractor's output for a clip of `soft_tokens` soft tokens (4 frames each)."""
    frames = 4 * soft_tokens
    return {
        "input_features": torch.zeros(1, frames, mel),
        "input_features_mask": torch.ones(1, frames, dtype=torch.bool),
    }


def example_image(geo: Geometry, soft_tokens: int) -> dict[str, torch.Tensor]:
    """A processor's output for an image of `soft_tokens` soft tokens in one row of cells: what a
    vision graph is traced with (its values do not matter, its shapes do)."""
    v = geo.vision
    k, n = v.pooling_kernel, soft_tokens
    xs, ys = torch.meshgrid(torch.arange(n * k), torch.arange(k), indexing="xy")
    pos = torch.stack((xs, ys), dim=-1).reshape(1, n * k * k, 2)  # (1, P, 2)
    return {"pixel_values": torch.full((1, n * k * k, 3 * v.patch_size**2), 0.5), "image_position_ids": pos}


def encoder_inputs(geo: Geometry, vision_table: torch.Tensor | None, graph: GraphKey) -> tuple[torch.Tensor, ...]:
    """An encoder graph's example inputs, made by the builders the server uses (contract/media_inputs.py)."""
    if graph.kind == "vision":
        return VisionInputs(geo, vision_table)(example_image(geo, graph.keys), graph.keys)
    return AudioInputs(geo)(example_audio(graph.keys), graph.keys)
