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

The drafter's bytes are an assumption unless a manifest names one (ASSUMED_DRAFTER): 4 layers, all
kv-shared (no K/V projections), shaped as the target's last four (hidden, query heads, single-wide
MLP), the input and output projections, and the centroid-masked head (2,048 centroids, 32 of them of
128 vocabulary rows each read per step), as transformers' Gemma4AssistantForCausalLM is built; at
tp 2 it is counted unsharded on one core. The real assistants may be narrower, so on that count the
gain is a lower estimate; as in roofline.py, compute, host work and the runtime's per-call overhead
(k + 1 calls per round instead of one) are not counted, so on those it is a ceiling."""

from __future__ import annotations

from dataclasses import dataclass

from contract.dtypes import DTYPES
from gemma4_port.ops.model_sizes import ModelSizes
from gemma4_port.ops.roofline import CORE_BYTES_PER_S, Roofline, roofline
from gemma4_port.port.kv import kv_shapes
from gemma4_port.source.variant import Variant

DRAFTER_LAYERS = 4
CENTROIDS = 2048
CENTROID_ROWS = 32 * 128  # top-32 centroids x 128 vocabulary rows each
ASSUMED_DRAFTER = (
    f"drafter: {DRAFTER_LAYERS} kv-shared layers at the target's widths, in/out projections, a centroid-masked "
    f"head ({CENTROIDS} centroids, {CENTROID_ROWS} vocabulary rows read per step); its attention reads the "
    "target's last sliding and last full K/V over the key bucket; the verify pass over k + 1 tokens reads what a "
    "decode step reads (bandwidth-bound); the drafter unsharded on one core at tp 2; acceptance independent per token"
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


def drafter_step_bytes(sizes: ModelSizes, v: Variant, keys: int) -> int:
    """Bytes one step of the assumed drafter (ASSUMED_DRAFTER) reads, at tp 1."""
    m = sizes.shard(1, 0)
    h, mlp = m.hidden, min(s.intermediate for s in m.layers)  # the single-wide MLP
    # Shaped as the target's last layers (E2B's: three sliding and a full one): q and o projections, MLP.
    layers = sum(2 * h * s.q_heads * s.head_dim + 3 * h * mlp for s in m.layers[-DRAFTER_LAYERS:])
    weights = layers + 2 * h * h + h * h + CENTROIDS * h + CENTROID_ROWS * h  # + pre/post projections, head
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
