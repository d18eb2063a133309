"""The image encoder port (gemma4_port/port/vision.py) and its host inputs (contract/media_inputs.py)
against transformers' own Gemma4VisionModel + Gemma4MultimodalEmbedder, on the tiny checkpoints'
random vision tower (clipped linears, standardize, pooling kernel 3)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from contract.media_inputs import VisionInputs
from gemma4_port.compile.encoders import example_image, load_encoder
from gemma4_port.compile.tracing import trace_quietly
from gemma4_port.port.lint import check_traced
from gemma4_port.verify.reference import load_reference
from support.builds import started


@pytest.fixture(scope="module")
def tower():
    b = started("tiny-12b", "image")
    return b, load_encoder("vision", b.vision, b.geo, b.reader), load_reference(b.ckpt).model


def _processed(b, height: int, width: int, seed: int = 0) -> dict:
    from PIL import Image
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    processor = Gemma4ImageProcessorPil(
        patch_size=b.vision.patch_size, pooling_kernel_size=b.vision.pooling_kernel_size
    )
    pixels = np.random.RandomState(seed).randint(0, 256, (height, width, 3), dtype=np.uint8)
    out = dict(processor(Image.fromarray(pixels), max_soft_tokens=b.geo.vision.max_soft_tokens, return_tensors="pt"))
    out.pop("num_soft_tokens_per_image")
    return out


@torch.no_grad()
@pytest.mark.parametrize("size", [(45, 61), (30, 90), (64, 64), (200, 13)])
def test_soft_tokens_match_transformers(tower, size):
    b, encoder, reference = tower
    features = _processed(b, *size)
    want = reference.get_image_features(features["pixel_values"], features["image_position_ids"]).pooler_output[0]
    inputs = VisionInputs(b.geo, b.tables.vision_positions)
    got = encoder(*inputs(features))[0]
    n = inputs.soft_tokens(features["image_position_ids"])
    assert n == want.shape[0] and got.shape == (b.geo.vision.bucket_for(n), b.geo.hidden)
    torch.testing.assert_close(got[:n], want, rtol=0, atol=2e-5)


@torch.no_grad()
def test_an_image_gives_the_same_soft_tokens_in_every_bucket_that_holds_it(tower):
    """A 20-token image (a strip of 20 cells) padded as the processor pads, in the 35 and the 70 bucket."""
    b, encoder, reference = tower
    small = example_image(b.geo, 20)
    P = b.geo.vision.max_soft_tokens * b.geo.vision.patches_per_token
    pad = P - small["pixel_values"].shape[1]
    small["pixel_values"] = torch.rand(small["pixel_values"].shape, generator=torch.Generator().manual_seed(1))
    features = {
        "pixel_values": torch.nn.functional.pad(small["pixel_values"], (0, 0, 0, pad)),
        "image_position_ids": torch.nn.functional.pad(small["image_position_ids"], (0, 0, 0, pad), value=-1),
    }
    want = reference.get_image_features(features["pixel_values"], features["image_position_ids"]).pooler_output[0]
    inputs = VisionInputs(b.geo, b.tables.vision_positions)
    assert b.geo.vision.bucket_for(20) == 35
    for bucket in (35, 70):
        got = encoder(*inputs(features, bucket))[0]
        assert got.shape[0] == bucket
        torch.testing.assert_close(got[:20], want, rtol=0, atol=2e-5)
    with pytest.raises(ValueError, match="does not fit bucket 16"):
        inputs(features, 16)


@torch.no_grad()
def test_the_traced_encoder_passes_the_graph_lint_and_needs_its_clipping(tower):
    """No lookup, index or fused attention in the graph (the host made them inputs); and the
    checkpoint's clipping bounds bite: without them the soft tokens differ."""
    b, encoder, _ = tower
    inputs = VisionInputs(b.geo, b.tables.vision_positions)(_processed(b, 45, 61))
    traced = trace_quietly(torch.jit.trace, encoder, inputs)
    check_traced(traced, "vision_70", b.geo.vocab)
    clipped = encoder(*inputs)
    torch.testing.assert_close(traced(*inputs), clipped, rtol=0, atol=0)
    layer = encoder.layers[0].q_proj
    saved = layer.input_min.clone(), layer.input_max.clone()
    layer.input_min.fill_(-float("inf")), layer.input_max.fill_(float("inf"))
    try:
        assert not torch.allclose(encoder(*inputs), clipped, atol=1e-4)
    finally:
        layer.input_min.copy_(saved[0]), layer.input_max.copy_(saved[1])
