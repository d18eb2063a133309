"""A manifest's variant: the graphs one artifact holds (tensor parallelism, batch, chunk and key buckets,
dtype) and a multimodal model's soft-token budgets."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from contract.typed import Frozen

# The budgets transformers' Gemma-4 image processor takes (image_processing_pil_gemma4.py).
SOFT_TOKEN_BUDGETS = (70, 140, 280, 560, 1120)


class _SoftTokenBudget(Frozen):
    """A media kind's soft tokens per item (`max_soft_tokens`, set by each kind) and the encoder graphs'
    buckets: an item runs in the smallest bucket that holds its soft tokens."""

    max_soft_tokens: int
    buckets: tuple[int, ...] = Field(
        (), description="soft-token buckets of the encoder graphs, increasing; default (max_soft_tokens,)"
    )

    @model_validator(mode="after")
    def _buckets_end_at_budget(self):
        b = list(self.buckets) or [self.max_soft_tokens]
        if b != sorted(set(b)) or b[0] < 1 or b[-1] != self.max_soft_tokens:
            raise ValueError(
                "buckets must be positive, strictly increasing and end at max_soft_tokens "
                f"({self.max_soft_tokens}), got {b}"
            )
        return self

    @property
    def soft_buckets(self) -> tuple[int, ...]:
        return self.buckets or (self.max_soft_tokens,)


class ImageBudget(_SoftTokenBudget):
    """Soft tokens per image: the processor's budget (each bucket holds bucket x k^2 patches)."""

    max_soft_tokens: Literal[70, 140, 280, 560, 1120] = Field(description="the image processor's max_soft_tokens")


class AudioBudget(_SoftTokenBudget):
    """Soft tokens per clip (one per 40 ms: four 10 ms mel frames); each bucket a multiple of the
    tower's attention chunk, checked at compile."""

    max_soft_tokens: int = Field(ge=1, le=750, description="the longest clip in soft tokens (750: 30 s)")


class Media(Frozen):
    image: ImageBudget | None = None
    audio: AudioBudget | None = None


class Variant(Frozen):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    tp: Literal[1, 2] = 1
    batch: int = Field(1, ge=1, le=64)
    buckets: tuple[int, ...] = Field(min_length=1)
    kv_max: int = Field(ge=2)
    # One decode graph per entry, and one prefill graph per entry and chunk bucket it holds: a step or
    # a chunk runs the smallest that holds its positions, so a short context neither attends over, nor
    # rewrites, nor ships mask rows for the whole cache.
    key_buckets: tuple[int, ...] = Field(
        min_length=1, description="cache lengths the decode and prefill graphs attend over; default (kv_max,)"
    )
    dtype: Literal["float32", "bfloat16"] = "bfloat16"
    prefill: Literal["device", "host"] = Field(
        "device",
        description="where a prompt's chunks run on inf2: device (the prefill graphs on the NeuronCores) or host (a "
        "CPU graph of the whole model writes the KV; the cores hold decode alone)",
    )
    media: Media | None = Field(None, description="soft-token budgets of a multimodal model's encoders")

    @model_validator(mode="before")
    @classmethod
    def _key_buckets_default_to_kv_max(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("key_buckets") and "kv_max" in data:
            return {**data, "key_buckets": (data["kv_max"],)}
        return data

    @model_validator(mode="after")
    def _buckets_fit(self) -> Variant:
        if list(self.buckets) != sorted(set(self.buckets)) or self.buckets[0] < 1:
            raise ValueError(f"buckets must be positive and strictly increasing, got {list(self.buckets)}")
        if self.buckets[-1] >= self.kv_max:
            raise ValueError(
                f"the largest bucket ({self.buckets[-1]}) must be smaller than kv_max ({self.kv_max}) "
                "so that at least one token can be generated"
            )
        kv = list(self.key_buckets)
        if kv != sorted(set(kv)) or kv[0] < 1 or kv[-1] != self.kv_max:
            raise ValueError(
                f"key_buckets must be positive, strictly increasing and end at kv_max ({self.kv_max}), got {kv}"
            )
        if self.media and self.media.image and self.media.image.max_soft_tokens > self.buckets[-1]:
            # An image's soft tokens see each other both ways on some models: a prefill chunk holds them whole.
            raise ValueError(
                f"an image of up to {self.media.image.max_soft_tokens} soft tokens does not fit the largest "
                f"bucket ({self.buckets[-1]}); raise the bucket or lower max_soft_tokens"
            )
        return self
