"""The audio encoder port (gemma4_port/port/audio.py) and its host inputs (contract/media_inputs.py
AudioInputs) against transformers' own Gemma4AudioModel + Gemma4MultimodalEmbedder, on tiny-e2b's
random conformer (clipped linears, chunked attention with its relative position term)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from contract.media_inputs import AudioInputs
from gemma4_port.compile.encoders import example_audio, load_encoder
from gemma4_port.compile.tracing import trace_quietly
from gemma4_port.port.lint import check_traced
from gemma4_port.verify.reference import load_reference
from support.builds import started


@pytest.fixture(scope="module")
def tower():
    b = started("tiny-e2b", "audio")
    return b, load_encoder("audio", b.audio, b.geo, b.reader), load_reference(b.ckpt).model


def _features(seconds: float, seed: int = 0) -> dict:
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor

    wave = (0.2 * np.random.RandomState(seed).randn(int(16000 * seconds))).astype(np.float32)
    return dict(Gemma4AudioFeatureExtractor()([wave], sampling_rate=16000, return_tensors="pt"))


@torch.no_grad()
@pytest.mark.parametrize("seconds", [0.3, 0.75, 1.8])
def test_soft_tokens_match_transformers_in_every_bucket_that_holds_them(tower, seconds):
    b, encoder, reference = tower
    features = _features(seconds)
    out = reference.get_audio_features(features["input_features"], features["input_features_mask"])
    want = out.pooler_output[out.attention_mask]
    inputs = AudioInputs(b.geo)
    n = inputs.soft_tokens(features["input_features_mask"])
    assert n == want.shape[0]
    for bucket in [x for x in b.geo.audio.soft_buckets if x >= n]:
        got = encoder(*inputs(features, bucket))[0]
        assert got.shape == (bucket, b.geo.hidden)
        torch.testing.assert_close(got[:n], want, rtol=0, atol=2e-5)


@torch.no_grad()
def test_a_clip_over_the_budget_is_refused_and_the_traced_graph_passes_the_lint(tower):
    b, encoder, _ = tower
    inputs = AudioInputs(b.geo)
    with pytest.raises(ValueError, match="over this model's budget of 48"):
        inputs(_features(2.5))
    example = inputs(example_audio(24), 24)
    traced = trace_quietly(torch.jit.trace, encoder, example)
    check_traced(traced, "audio_24", b.geo.vocab)
    torch.testing.assert_close(traced(*example), encoder(*example), rtol=0, atol=0)
