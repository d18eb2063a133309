"""Encoded media to what Gemma-4's processors take: an image's bytes to a PIL image, an audio clip's
bytes to a mono waveform at the feature extractor's rate. Every limit is checked from the file's
header, before anything is decoded; a file that is not what it claims to be is refused (a 400).

Images: PIL, only in the formats the operator allows (GEMMA4_MEDIA_IMAGE_FORMATS); PIL's own
decompression-bomb guard (MAX_IMAGE_PIXELS) is set to the pixel limit, so both refuse by one number.
Audio: soundfile (libsndfile: wav and mp3) reads the header; transformers' own `load_audio` decodes
and resamples (its soundfile backend: soundfile and soxr, the steps of librosa.load)."""

from __future__ import annotations

import base64
import io
import warnings

import numpy as np
import soundfile
from PIL import Image, UnidentifiedImageError
from transformers.audio_utils import load_audio

from runtime.api.media_fetch import MediaLimitError
from runtime.model.media import MediaError
from runtime.settings import MediaLimits

# libsndfile's name of each format OpenAI's `input_audio.format` names
AUDIO_FORMATS = {"wav": ("WAV", "WAVEX"), "mp3": ("MP3",)}


def guard_pil(limits: MediaLimits) -> None:
    """PIL's process-wide bomb guard at the server's pixel limit. Images between it and twice it only
    warn in PIL; image() refuses those itself, so PIL's warning is silenced rather than logged per request."""
    Image.MAX_IMAGE_PIXELS = limits.max_image_pixels
    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)


def image(data: bytes, limits: MediaLimits) -> Image.Image:
    """The decoded image (its first frame, for an animated one)."""
    formats = tuple(f.upper() for f in limits.image_formats)
    allowed = f"{', '.join(formats)} (GEMMA4_MEDIA_IMAGE_FORMATS)"
    try:
        img = Image.open(io.BytesIO(data), formats=formats)
    except UnidentifiedImageError:
        raise MediaError(f"is not an image in one of the formats this server reads: {allowed}") from None
    except Image.DecompressionBombError as exc:
        raise MediaLimitError(limits.refusal("max_image_pixels", f"is too large to decode ({exc})")) from None
    except (OSError, ValueError, SyntaxError) as exc:  # PIL's plugins refuse a broken header with any of them
        raise MediaError(f"could not be read as an image: {exc}") from None
    width, height = img.size
    if width * height > limits.max_image_pixels:
        raise MediaLimitError(limits.refusal("max_image_pixels", f"is {width} x {height} = {width * height} pixels"))
    try:
        img.load()
    except Image.DecompressionBombError as exc:
        raise MediaLimitError(limits.refusal("max_image_pixels", f"is too large to decode ({exc})")) from None
    except (OSError, ValueError, SyntaxError) as exc:  # truncated or corrupt data
        raise MediaError(f"could not be decoded as {img.format}: {exc}") from None
    return img


def audio(data: bytes, declared: str, limits: MediaLimits, sampling_rate: int) -> np.ndarray:
    """The clip as float32 samples, mono, at `sampling_rate`; `declared` is the request's format
    (wav or mp3), which the data must be."""
    try:
        info = soundfile.info(io.BytesIO(data))
    except (soundfile.SoundFileError, RuntimeError) as exc:
        raise MediaError(f"could not be read as {declared} audio: {exc}") from None
    if info.format not in AUDIO_FORMATS[declared]:
        raise MediaError(f"is declared {declared} but holds {info.format} audio; send it with its own format")
    if info.samplerate <= 0 or info.frames <= 0:
        raise MediaError("holds no audio samples")
    seconds = info.frames / info.samplerate
    if seconds > limits.max_audio_seconds:
        raise MediaLimitError(limits.refusal("max_audio_seconds", f"is {seconds:.2f} s long"))
    # load_audio reads a data: URI itself (never a path or a URL when given one)
    uri = f"data:audio/{declared};base64,{base64.b64encode(data).decode()}"
    try:
        return load_audio(uri, sampling_rate=sampling_rate, backend="soundfile")
    except (soundfile.SoundFileError, RuntimeError, ValueError) as exc:
        raise MediaError(f"could not be decoded as {declared} audio: {exc}") from None
