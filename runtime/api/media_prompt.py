"""A request's images and audio clips made ready for the engine: each part's bytes read (a data: URL,
a fetch, base64 audio), decoded, preprocessed by transformers' own Gemma-4 processor classes, then
the placeholders the chat template wrote for them expanded as Gemma4Processor expands them (boi, n
soft tokens, eoi), giving the prompt's ids and one MediaInput per part for Runner.start.

The template writes one placeholder (`<|image|>`, `<|audio|>`) where each part is; the n of each
item is its processor's (the image processor's num_soft_tokens_per_image; for audio the frames the
encoder's two stride-2 convolutions leave of the feature extractor's mask, as
Gemma4Processor.replace_audio_token counts them)."""

from __future__ import annotations

import collections
import hashlib
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from transformers.models.gemma4 import Gemma4AudioFeatureExtractor, Gemma4ImageProcessorPil

from contract.artifact import AUDIO_PROCESSOR, IMAGE_PROCESSOR
from runtime.api import media_decode, media_fetch
from runtime.api.media_fetch import MediaLimitError
from runtime.model.loader import LoadedModel
from runtime.model.media import MediaError, MediaInput
from runtime.settings import MediaLimits

Kind = Literal["image", "audio"]


@dataclass(frozen=True)
class MediaPart:
    """One media part of a request, as its schema read it: where it is (`param`, for refusals) and
    its source, an image's URL or an audio clip's base64 data and format."""

    kind: Kind
    param: str
    source: str
    audio_format: Literal["wav", "mp3"] | None = None


@dataclass(frozen=True)
class Prepared:
    """A part ready for the engine: its soft tokens' count, its processor features, its bytes' digest."""

    kind: Kind
    length: int
    digest: str
    features: dict[str, torch.Tensor]


class MediaProcessors:
    """transformers' Gemma-4 image processor (its PIL backend) and audio feature extractor, as the
    artifact's encoders take them (None: the model has no such encoder), and the tokenizer's tokens
    that stand for and wrap an item of each kind."""

    def __init__(
        self,
        tokenizer,
        image_processor: Gemma4ImageProcessorPil | None = None,
        feature_extractor: Gemma4AudioFeatureExtractor | None = None,
        audio_budget: int | None = None,
    ):
        """`image_processor` at the artifact's soft-token budget; `audio_budget`: the most soft tokens
        the audio encoder takes for one clip."""
        self.image_processor, self.feature_extractor, self.audio_budget = (
            image_processor,
            feature_extractor,
            audio_budget,
        )
        ids = tokenizer.convert_tokens_to_ids
        # kind -> (its placeholder id, the id that opens an item, the id that closes it)
        self.wrap: dict[str, tuple[int, int, int]] = {}
        for kind, (token, opens, closes) in {
            "image": ("image_token", "boi_token", "eoi_token"),
            "audio": ("audio_token", "boa_token", "eoa_token"),
        }.items():
            names = [getattr(tokenizer, n, None) for n in (token, opens, closes)]
            if all(names):
                self.wrap[kind] = (ids(names[0]), ids(names[1]), ids(names[2]))

    def image(self, data: bytes, limits: MediaLimits) -> Prepared:
        if self.image_processor is None:
            raise MediaError("this model has no image encoder")
        img = media_decode.image(data, limits)
        out = self.image_processor(images=[img], return_tensors="pt")
        features = {"pixel_values": out["pixel_values"], "image_position_ids": out["image_position_ids"]}
        return Prepared("image", int(out["num_soft_tokens_per_image"][0]), digest(data), features)

    def audio(self, data: bytes, audio_format: Literal["wav", "mp3"], limits: MediaLimits) -> Prepared:
        if self.feature_extractor is None:
            raise MediaError("this model has no audio encoder")
        wave = media_decode.audio(data, audio_format, limits, self.feature_extractor.sampling_rate)
        out = self.feature_extractor([wave], return_tensors="pt")
        n = audio_soft_tokens(out["input_features_mask"][0].numpy())
        if self.audio_budget is not None and n > self.audio_budget:
            raise MediaError(f"makes {n} soft tokens; this model's audio encoder takes at most {self.audio_budget}")
        features = {"input_features": out["input_features"], "input_features_mask": out["input_features_mask"]}
        return Prepared("audio", n, digest(data), features)


def processors_for(model: LoadedModel, limits: MediaLimits) -> MediaProcessors:
    """The processors of the artifact's encoders, with the checkpoint's settings it carries (its
    IMAGE_PROCESSOR and AUDIO_PROCESSOR folders), the image processor at the artifact's soft-token
    budget. PIL's bomb guard is set to the server's pixel limit before any image is opened."""
    geo = model.meta.geometry
    media_decode.guard_pil(limits)
    image_processor = feature_extractor = None
    if geo.vision is not None:
        image_processor = Gemma4ImageProcessorPil.from_pretrained(
            str(model.folder / IMAGE_PROCESSOR), max_soft_tokens=geo.vision.max_soft_tokens
        )
    if geo.audio is not None:
        feature_extractor = Gemma4AudioFeatureExtractor.from_pretrained(str(model.folder / AUDIO_PROCESSOR))
    budget = geo.audio.max_soft_tokens if geo.audio is not None else None
    return MediaProcessors(model.tokenizer, image_processor, feature_extractor, budget)


def audio_soft_tokens(mask: np.ndarray) -> int:
    """The soft tokens of one clip: its feature frames' mask through two stride-2 convolutions
    (kernel 3, padding 1), the frames left that hold audio."""
    for _ in range(2):
        mask = mask[::2][: (len(mask) - 1) // 2 + 1]
    return int(mask.sum())


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_counts(parts: list[MediaPart], limits: MediaLimits, kinds: set[str]) -> None:
    """The request's parts against what the model takes and the per-request limits, before any is read."""
    for kind, field in (("image", "max_images"), ("audio", "max_audios")):
        mine = [p for p in parts if p.kind == kind]
        if mine and kind not in kinds:
            raise MediaError(f"this model has no {kind} encoder; it takes {', '.join(sorted(kinds)) or 'text only'}")
        if len(mine) > getattr(limits, field):
            raise MediaLimitError(limits.refusal(field, f"the request has {len(mine)} {kind} parts"))


def prepare(part: MediaPart, processors: MediaProcessors, limits: MediaLimits) -> Prepared:
    """One part read, decoded and preprocessed (on the state's media threads)."""
    if part.kind == "audio":
        assert part.audio_format is not None  # the schema requires it
        _, data = media_fetch.data_url(
            f"data:;base64,{part.source}", limits.max_audio_bytes, bytes_limit(limits, "max_audio_bytes")
        )
        return processors.audio(data, part.audio_format, limits)
    if part.source[:5].lower() == "data:":
        _, data = media_fetch.data_url(part.source, limits.max_image_bytes, bytes_limit(limits, "max_image_bytes"))
    else:
        data = media_fetch.fetch(part.source, limits, limits.max_image_bytes, bytes_limit(limits, "max_image_bytes"))
    return processors.image(data, limits)


def bytes_limit(limits: MediaLimits, field: str) -> str:
    return limits.refusal(field, "").removeprefix("; ")


def expand(ids: list[int], items: list[Prepared], processors: MediaProcessors) -> tuple[list[int], list[MediaInput]]:
    """The prompt with each placeholder the template wrote replaced by its item's boi, soft tokens and
    eoi, in order, and the items as MediaInputs there. A placeholder with no part to fill it (a text
    that holds `<|image|>` itself), or a part the template wrote no placeholder for, is refused."""
    waiting = {kind: collections.deque(i for i in items if i.kind == kind) for kind in processors.wrap}
    kind_of = {wrap[0]: kind for kind, wrap in processors.wrap.items()}
    out: list[int] = []
    media: list[MediaInput] = []
    for t in ids:
        kind = kind_of.get(t)
        if kind is None:
            out.append(t)
            continue
        if not waiting[kind]:
            raise MediaError(
                f"the prompt holds more {kind} placeholders than the request has {kind} parts: a text "
                f"part may not contain the placeholder token itself"
            )
        item = waiting[kind].popleft()
        placeholder, opens, closes = processors.wrap[kind]
        out.append(opens)
        media.append(MediaInput(kind, len(out), item.length, item.digest, item.features))
        out += [placeholder] * item.length
        out.append(closes)
    left = sum(len(q) for q in waiting.values())
    if left:
        raise MediaError(f"the chat template placed no placeholder for {left} media parts; its model cannot see them")
    return out, media
