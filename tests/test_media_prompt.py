"""runtime.api.media_prompt: parts preprocessed by transformers' Gemma-4 processor classes and their
placeholders expanded as Gemma4Processor expands them (boi, n soft tokens, eoi)."""

from __future__ import annotations

import base64
import io
import re
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile
from PIL import Image
from transformers.models.gemma4 import Gemma4AudioFeatureExtractor, Gemma4ImageProcessorPil, Gemma4Processor

from gemma4_port.source.toy_tokenizer import train_tokenizer
from runtime.api.media_fetch import MediaLimitError
from runtime.api.media_prompt import MediaPart, MediaProcessors, check_counts, expand, prepare
from runtime.model.media import MediaError, check_media
from runtime.settings import MediaLimits


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(1024, 0)


@pytest.fixture(scope="module")
def processors(tok):
    image_processor = Gemma4ImageProcessorPil(patch_size=4, pooling_kernel_size=3, max_soft_tokens=70)
    return MediaProcessors(tok, image_processor, Gemma4AudioFeatureExtractor(), audio_budget=750)


def png(width: int, height: int, seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def wav(seconds: float) -> str:
    out = io.BytesIO()
    soundfile.write(out, 0.1 * np.sin(np.arange(int(16000 * seconds)) / 7), 16000, format="WAV")
    return base64.b64encode(out.getvalue()).decode()


def test_an_image_is_what_gemma4s_image_processor_makes_of_it(processors):
    data = png(61, 45)
    item = prepare(MediaPart("image", "messages.0.content.0", data_url(data)), processors, MediaLimits())
    reference = Gemma4ImageProcessorPil(patch_size=4, pooling_kernel_size=3, max_soft_tokens=70)(
        images=[Image.open(io.BytesIO(data))], return_tensors="pt"
    )
    assert item.length == reference["num_soft_tokens_per_image"][0] == 63  # 61 x 45 at a budget of 70
    assert set(item.features) == {"pixel_values", "image_position_ids"}
    assert item.features["pixel_values"].shape == (1, 70 * 9, 3 * 4 * 4)  # padded to the budget's patches
    assert (item.features["pixel_values"] == reference["pixel_values"]).all()
    assert (item.features["image_position_ids"] == reference["image_position_ids"]).all()
    assert item.digest == prepare(MediaPart("image", "x", data_url(data)), processors, MediaLimits()).digest


def test_placeholders_expand_as_gemma4processor_expands_them(tok, processors):
    image = prepare(MediaPart("image", "p", data_url(png(61, 45))), processors, MediaLimits())
    clip = prepare(MediaPart("audio", "p", wav(1.0), "wav"), processors, MediaLimits())
    text = f"<|turn>user\nlook {tok.image_token} and hear {tok.audio_token}<turn|>"
    ids, media = expand(tok(text, add_special_tokens=False).input_ids, [image, clip], processors)

    names = SimpleNamespace(boi_token=tok.boi_token, eoi_token=tok.eoi_token, image_token=tok.image_token)
    names.boa_token, names.eoa_token, names.audio_token = tok.boa_token, tok.eoa_token, tok.audio_token
    image_text = Gemma4Processor.replace_image_token(names, {"num_soft_tokens_per_image": [image.length]}, 0)
    audio_text = Gemma4Processor.replace_audio_token(
        names, {"input_features_mask": clip.features["input_features_mask"].numpy()}, 0
    )
    expected = tok(
        text.replace(tok.image_token, image_text).replace(tok.audio_token, audio_text), add_special_tokens=False
    )
    assert ids == expected.input_ids
    assert [(m.kind, m.length) for m in media] == [("image", 63), ("audio", clip.length)] and clip.length == 25
    assert ids[media[0].offset - 1] == tok.convert_tokens_to_ids(tok.boi_token)
    assert ids[media[0].offset + media[0].length] == tok.convert_tokens_to_ids(tok.eoi_token)
    placeholders = {"image": tok.image_token_id, "audio": tok.convert_tokens_to_ids(tok.audio_token)}
    check_media(ids, media, placeholders, ("image", "audio"))


def test_a_placeholder_needs_its_part_and_a_part_its_placeholder(tok, processors):
    image = prepare(MediaPart("image", "p", data_url(png(20, 20))), processors, MediaLimits())
    twice = tok(f"a {tok.image_token} b {tok.image_token}", add_special_tokens=False).input_ids
    with pytest.raises(MediaError, match="more image placeholders than the request has image parts"):
        expand(twice, [image], processors)
    with pytest.raises(MediaError, match="placed no placeholder for 1 media parts"):
        expand(tok("no place for it", add_special_tokens=False).input_ids, [image], processors)


def test_counts_and_kinds_are_checked_before_anything_is_read():
    parts = [MediaPart("image", f"messages.0.content.{i}", "data:,") for i in range(3)]
    message = "the request has 3 image parts; the limit is 2 (GEMMA4_MEDIA_MAX_IMAGES)"
    with pytest.raises(MediaLimitError, match=re.escape(message)):
        check_counts(parts, MediaLimits(max_images=2), {"image"})
    with pytest.raises(MediaError, match="this model has no audio encoder; it takes image"):
        check_counts([MediaPart("audio", "p", "", "wav")], MediaLimits(), {"image"})
    with pytest.raises(MediaError, match="no image encoder; it takes text only"):
        check_counts(parts[:1], MediaLimits(), set())


def test_a_bad_image_is_refused(processors):
    not_png = "data:image/png;base64," + base64.b64encode(b"GIF89a but nothing else").decode()
    with pytest.raises(MediaError, match="not an image in one of the formats"):
        prepare(MediaPart("image", "p", not_png), processors, MediaLimits())
    strip = prepare(MediaPart("image", "p", data_url(png(4000, 1))), processors, MediaLimits())
    assert strip.length == 70  # an extreme aspect still fits the budget: one row of pools
