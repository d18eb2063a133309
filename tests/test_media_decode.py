"""runtime.api.media_decode: images through PIL and audio through soundfile and transformers'
load_audio, every limit checked from the header first, bad data a clear refusal."""

from __future__ import annotations

import base64
import io
import re

import numpy as np
import pytest
import soundfile
from PIL import Image
from transformers.audio_utils import load_audio

from runtime.api import media_decode
from runtime.model.media import MediaError
from runtime.settings import MediaLimits


def encoded(img: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    img.save(out, format=fmt)
    return out.getvalue()


def clip(seconds: float, fmt: str, rate: int = 22050, channels: int = 1) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    wave = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    out = io.BytesIO()
    soundfile.write(out, np.stack([wave] * channels, axis=-1), rate, format=fmt)
    return out.getvalue()


PHOTO = Image.fromarray(np.random.default_rng(0).integers(0, 255, (45, 61, 3), dtype=np.uint8))


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_images_in_the_allowed_formats_decode(fmt):
    img = media_decode.image(encoded(PHOTO, fmt), MediaLimits())
    assert (img.format, img.size) == (fmt, (61, 45))


def test_what_is_not_an_allowed_image_is_refused():
    with pytest.raises(MediaError, match="not an image in one of the formats.*PNG, JPEG, WEBP, GIF"):
        media_decode.image(b"hello, not an image", MediaLimits())
    with pytest.raises(MediaError, match="not an image in one of the formats"):  # BMP is PIL's, not allowed here
        media_decode.image(encoded(PHOTO, "BMP"), MediaLimits())
    assert media_decode.image(encoded(PHOTO, "BMP"), MediaLimits(image_formats=("BMP",))).format == "BMP"
    broken = encoded(PHOTO, "PNG")[:200]  # a header that promises more than is there
    with pytest.raises(MediaError, match="could not be decoded as PNG"):
        media_decode.image(broken, MediaLimits())


def test_pixels_are_counted_from_the_header_before_decoding():
    wide = encoded(Image.new("RGB", (3000, 2000)), "PNG")  # 6 MP, a few kB compressed
    limits = MediaLimits(max_image_pixels=5_000_000)
    message = "is 3000 x 2000 = 6000000 pixels; the limit is 5000000 (GEMMA4_MEDIA_MAX_IMAGE_PIXELS)"
    with pytest.raises(MediaError, match=re.escape(message)):
        media_decode.image(wide, limits)


def test_pils_own_bomb_guard_refuses_by_the_same_limit():
    """Past twice MAX_IMAGE_PIXELS PIL refuses to open the file at all; the server's refusal names its limit."""
    limits = MediaLimits(max_image_pixels=1_000_000)
    previous = Image.MAX_IMAGE_PIXELS
    try:
        media_decode.guard_pil(limits)
        assert Image.MAX_IMAGE_PIXELS == 1_000_000
        with pytest.raises(MediaError, match="too large to decode.*GEMMA4_MEDIA_MAX_IMAGE_PIXELS"):
            media_decode.image(encoded(Image.new("L", (2000, 1001)), "PNG"), limits)
    finally:
        Image.MAX_IMAGE_PIXELS = previous


@pytest.mark.parametrize("fmt,channels", [("wav", 1), ("wav", 2), ("mp3", 1)])
def test_audio_decodes_as_transformers_loads_it(fmt, channels):
    data = clip(1.5, fmt.upper(), channels=channels)
    wave = media_decode.audio(data, fmt, MediaLimits(), 16000)
    reference = load_audio(f"data:audio/{fmt};base64,{base64.b64encode(data).decode()}", 16000, backend="soundfile")
    assert wave.dtype == np.float32 and wave.ndim == 1
    np.testing.assert_array_equal(wave, reference)
    assert abs(len(wave) / 16000 - 1.5) < 0.1  # resampled to 16 kHz (mp3 frames pad it a little)


def test_bad_audio_is_refused():
    with pytest.raises(MediaError, match="could not be read as wav audio"):
        media_decode.audio(b"RIFF but not really", "wav", MediaLimits(), 16000)
    with pytest.raises(MediaError, match="is declared wav but holds MP3 audio"):
        media_decode.audio(clip(0.5, "MP3"), "wav", MediaLimits(), 16000)
    too_long = "is 3.00 s long; the limit is 2.0 (GEMMA4_MEDIA_MAX_AUDIO_SECONDS)"
    with pytest.raises(MediaError, match=re.escape(too_long)):
        media_decode.audio(clip(3.0, "WAV"), "wav", MediaLimits(max_audio_seconds=2), 16000)
