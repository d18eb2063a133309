"""Speculative decoding on the decode roofline (roofline.py): the per-stream gain a drafter can give a
variant on inf2, from the bytes each step moves and an acceptance rate.

A round drafts k tokens (k drafter steps) and checks them in one target pass over k + 1 tokens. That
pass reads every weight once, as a decode step does: at k + 1 <= 8 tokens it does ~2(k + 1) FLOPs per
weight byte, far below the ~230 FLOPs per byte where inf2's ~190 bf16 TFLOPS per chip would overtake
its 820 GiB/s, so it is counted at the decode step's bytes (its k + 1 positions are written within the
leading ones a step reads and writes back). A drafter step reads the drafter's weights and the
target's K/V of the two layers it attends to (the last sliding and the last full cache-owning layer)
over the key bucket. With each drafted token accepted with probability a, independently (the usual
model of speculative sampling, Leviathan et al. 2023), a round emits E = (1 - a^(k+1)) / (1 - a)
tokens; the gain per stream is E x decode step / (verify pass + k x drafter step).

The drafter's bytes come from the one definition `plan` counts (ModelSizes.drafter_weights: the
manifest's drafter config, a folder's config.json, a random drafter's or the assumed shapes of a hub
assistant, source/configs.py drafter_config_for), all read once per step, less the head rows a step does
not read: a tied head multiplies by the whole vocabulary x hidden embedding every step; the centroid
head (use_ordered_embeddings) scores the centroids and then reads only the top ones' rows, as
transformers' Gemma4AssistantMaskedEmbedder gathers them. port/drafter.py's centroid head still
computes every row (no gather on the device), so for an ordered drafter the figure is what a gathering
graph would give, a ceiling for ours. At tp 2 the drafter is counted unsharded on one core. As in
roofline.py, compute, host work and the runtime's per-call overhead (k + 1 calls per round instead of
one) are not counted, so the gain is a ceiling."""

from __future__ import annotations

from dataclasses import dataclass

from contract.dtypes import DTYPES
from gemma4_port.ops.model_sizes import ModelSizes
from gemma4_port.ops.roofline import CORE_BYTES_PER_S, Roofline, roofline
from gemma4_port.port.kv import kv_shapes
from gemma4_port.port.sharding import shard_drafter
from gemma4_port.source.variant import Variant

ASSUMPTIONS = (
    "the drafter's weights as plan counts them (its manifest's config), all read per step but a centroid head's "
    "unselected rows; its attention reads the target's last sliding and last full K/V over the key bucket; the "
    "verify pass over k + 1 tokens reads what a decode step reads (bandwidth-bound); the drafter unsharded on one "
    "core at tp 2; acceptance independent per token"
)


@dataclass(frozen=True)
class Speculation:
    variant: str
    keys: int
    k: int
    acceptance: float
    decode_s: float  # one plain decode step
    verify_s: float  # one target pass over k + 1 tokens
    draft_s: float  # one drafter step

    @property
    def tokens_per_round(self) -> float:
        a = self.acceptance
        return float(self.k + 1) if a >= 1 else (1 - a ** (self.k + 1)) / (1 - a)

    @property
    def round_s(self) -> float:
        return self.verify_s + self.k * self.draft_s

    @property
    def per_stream(self) -> float:
        return self.tokens_per_round / self.round_s

    @property
    def gain(self) -> float:
        """Tokens per second per stream with speculation over without."""
        return self.per_stream * self.decode_s


def head_rows(sizes: ModelSizes) -> int:
    """Vocabulary rows of the drafter's head one step reads: all of them for a tied head, the kept
    centroids' blocks (top_k x V / centroids) for the centroid head."""
    d = shard_drafter(sizes.drafter_config, sizes.shard(1, 0))
    vocab = d.model.vocab
    return d.top_k * (vocab // d.centroids) if d.ordered else vocab


def drafter_head(sizes: ModelSizes) -> str:
    """The drafter's head in words, for the printed assumptions."""
    d = shard_drafter(sizes.drafter_config, sizes.shard(1, 0))
    if d.ordered:
        return f"centroid head ({d.centroids} centroids, top {d.top_k}: {head_rows(sizes):,} rows read per step)"
    return f"tied head (all {head_rows(sizes):,} vocabulary rows read per step)"


def drafter_step_bytes(sizes: ModelSizes, v: Variant, keys: int) -> int:
    """Bytes one step of the manifest's drafter reads, at tp 1: its weights (ModelSizes, as plan counts
    them) but the head rows it does not read, and the target's K/V it attends to."""
    if sizes.drafter_config is None:
        raise ValueError("the manifest names no drafter: its speculation is prompt lookup alone")
    m, head = sizes.shard(1, 0), shard_drafter(sizes.drafter_config, sizes.shard(1, 0)).model
    weights = sizes.drafter_weights(1, 0) - (head.vocab - head_rows(sizes)) * head.hidden  # its head is (V, H)
    shapes = kv_shapes(m, 1, v.kv_max, sizes.ring(v))
    kinds = [m.layers[i].kind for i in m.cache_layers for _ in "kv"]
    kv = 0
    for kind in ("sliding", "full"):
        owned = [shape for shape, k in zip(shapes, kinds, strict=True) if k == kind][-2:]  # the last owner's K, V
        kv += sum(b * heads * min(keys, s) * d for b, heads, s, d in owned)
    return DTYPES[v.dtype].itemsize * (weights + kv)


def speculation(sizes: ModelSizes, v: Variant, keys: int, k: int, acceptance: float, drafter: bool) -> Speculation:
    """Batch 1 at `keys` keys: the roofline of a decode step, of a verify pass and of a drafter step
    (none for prompt lookup, whose drafts are n-grams the host finds in the prompt)."""
    step: Roofline = roofline(sizes, v, keys, 1)
    draft = drafter_step_bytes(sizes, v, keys) / CORE_BYTES_PER_S if drafter else 0.0
    # The verify pass moves a decode step's bytes: its k + 1 positions are written within the leading
    # positions that a step over `keys` keys reads and writes back anyway.
    return Speculation(v.name, keys, k, acceptance, step.step_s(), step.step_s(), draft)


def break_even_acceptance(sizes: ModelSizes, v: Variant, keys: int, k: int) -> float:
    """The acceptance at which the manifest's drafter gains nothing (gain 1; the gain grows with the
    acceptance): below it, speculation with the drafter is slower than decoding alone."""
    low, high = 0.0, 1.0
    for _ in range(30):  # bisection to ~1e-9
        mid = (low + high) / 2
        low, high = (mid, high) if speculation(sizes, v, keys, k, mid, drafter=True).gain < 1 else (low, mid)
    return high
