"""`build.py verify`'s media prompts: synthetic images (seeded noise, so any size and aspect) through
the artifact's own image processor (transformers' Gemma4ImageProcessorPil at the variant's budget)
and synthetic clips (seeded tones in noise) through its feature extractor, laid out as Gemma-4's
processor lays them out (boi / boa, one placeholder per soft token, eoi / eoa), in the places that
stress the host side: one image, two, one deep inside a prompt many chunks long, one where the
largest bucket's chunk boundary falls inside it, a repeated image whose KV is reused; a clip, and a
clip beside an image."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import numpy as np

from contract.artifact import AUDIO_PROCESSOR, IMAGE_PROCESSOR
from contract.media_inputs import AudioInputs
from gemma4_port.verify.agreement import Case
from runtime.model.media import MediaInput

STEPS = 6


def by_kind(media) -> tuple[list[dict], list[dict]]:
    """The features of a prompt's images and of its clips, each in order: what the reference takes."""
    return [m.features for m in media if m.kind == "image"], [m.features for m in media if m.kind == "audio"]


class MediaPrompts:
    def __init__(self, folder: Path, meta, tokenizer):
        from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
        from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

        self.geo = meta.geometry
        folder = Path(folder)
        self.processor = (
            Gemma4ImageProcessorPil.from_pretrained(str(folder / IMAGE_PROCESSOR)) if self.geo.vision else None
        )
        self.extractor = (
            Gemma4AudioFeatureExtractor.from_pretrained(str(folder / AUDIO_PROCESSOR)) if self.geo.audio else None
        )
        self.tok = tokenizer
        self.rng = random.Random(f"{meta.name}/{meta.variant}/images")

    def image(self, seed: int, height: int, width: int) -> tuple[bytes, dict]:
        """PNG bytes of a noise image and the processor's features for it."""
        import io

        from PIL import Image

        pixels = np.random.RandomState(seed).randint(0, 256, (height, width, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="PNG")
        features = dict(
            self.processor(
                Image.fromarray(pixels), max_soft_tokens=self.geo.vision.max_soft_tokens, return_tensors="pt"
            )
        )
        features.pop("num_soft_tokens_per_image")
        return buf.getvalue(), features

    def clip(self, seed: int, seconds: float) -> tuple[bytes, dict]:
        """A 16 kHz tone in noise (its samples' bytes) and the feature extractor's features for it."""
        rng = np.random.RandomState(seed)
        t = np.arange(int(16000 * seconds)) / 16000
        wave = (0.3 * np.sin(2 * np.pi * rng.uniform(200, 800) * t) + 0.05 * rng.randn(t.size)).astype(np.float32)
        features = dict(self.extractor([wave], sampling_rate=16000, return_tensors="pt"))
        return wave.tobytes(), features

    def words(self, n: int) -> list[int]:
        return [self.rng.randrange(8, self.geo.vocab) for _ in range(n)]

    def prompt(self, parts) -> tuple[list[int], tuple[MediaInput, ...]]:
        """parts: token lists and (bytes, features) images -> ids and the images as the runner takes them."""
        ids, media = [self.tok.bos_token_id], []
        for part in parts:
            if isinstance(part, list):
                ids += part
                continue
            raw, features = part
            kind = "audio" if "input_features" in features else "image"
            if kind == "audio":
                n = AudioInputs.soft_tokens(features["input_features_mask"])
                markers = self.tok.boa_token_id, self.tok.eoa_token_id
            else:
                n = int((features["image_position_ids"][0] >= 0).all(-1).sum()) // self.geo.vision.patches_per_token
                markers = self.tok.boi_token_id, self.tok.eoi_token_id
            ids.append(markers[0])
            media.append(MediaInput(kind, len(ids), n, hashlib.sha256(raw).hexdigest(), features))
            ids += [self.geo.placeholders[kind]] * n + [markers[1]]
        return ids, tuple(media)

    def cases(self) -> list[Case]:
        big, room = self.geo.buckets[-1], self.geo.max_prompt - STEPS
        out = []

        def add(name, parts, steps=STEPS):
            ids, media = self.prompt(parts)
            if len(ids) + steps <= self.geo.kv_max:
                out.append(Case(name, ids, steps, media=media))

        if self.geo.audio:
            add("audio:one", [self.words(3), self.clip(1, 1.0), self.words(4)])
            if self.geo.vision:
                add("audio:beside-image", [self.words(2), self.image(8, 40, 40), self.words(2), self.clip(2, 0.6)])
        if not self.geo.vision:
            return out

        add("image:one", [self.words(3), self.image(1, 45, 61), self.words(4)])
        add("image:two", [self.words(2), self.image(2, 30, 90), self.words(2), self.image(3, 64, 64), self.words(3)])
        first = self.prompt([self.words(1), self.image(4, 50, 50)])[1][0]
        # The image starts a few tokens before the first chunk's end, so that boundary falls inside it.
        add("image:across-chunk", [self.words(big - 5 - first.offset), self.image(4, 50, 50), self.words(5)])
        image = self.image(5, 40, 70)
        n = self.prompt([image])[1][0].length
        add("image:many-chunks", [self.words(big + 7), image, self.words(max(1, room - 2 * big - n - 10))])
        return out

    def run_reuse(self, runner) -> list[tuple[Case, tuple]]:
        if not self.geo.vision:
            return []
        """A second turn with the same image (its KV kept: the image matches by its bytes' digest), then
        one with an image of the same size but other bytes (kept only up to it), each run where the
        slot holds the turn before."""
        same, other = self.image(6, 45, 61), self.image(7, 45, 61)
        head, tail, more = self.words(4), self.words(3), self.words(2)
        first, media = self.prompt([head, same, tail])
        runner.greedy(first, 2, media=media)
        out = []
        for name, image in (("image:reuse-same", same), ("image:other-bytes", other)):
            ids, media = self.prompt([head, image, tail, more])
            case = Case(name, ids, STEPS, reused=runner.reusable(0, ids, media), media=media)
            out.append((case, runner.greedy(ids, STEPS, reused=case.reused, media=media)))
        return out
