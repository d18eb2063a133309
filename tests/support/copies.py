"""A fork's KV copy, judged bit for bit: KV tensors that hold what a copy must carry exactly
(-0.0, inf, NaN, and distinct values in every slot), and the check of a copy's result."""

from __future__ import annotations

import torch

from contract.dtypes import BITS


def planted_kv(shapes, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    """Random KV tensors (B, KVH, S, D) whose every slot also holds -0.0, inf and NaN."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for shape in shapes:
        t = torch.randn(shape, generator=g).to(dtype)
        t[:, :, 0, 0], t[:, :, -1, -1], t[:, :, 1 % shape[2], 0] = -0.0, float("nan"), float("-inf")
        out.append(t)
    return out


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(BITS[t.dtype])


def check_copied(before, after, kinds, source: int, target: int, keep: int) -> None:
    """The target slot holds the source's bits in a global cache's first `keep` positions and in every
    ring position, its own bits elsewhere; every other slot is untouched."""
    assert len(before) == len(after) == len(kinds)
    for i, (old, new, kind) in enumerate(zip(before, after, kinds)):
        assert new.shape == old.shape and new.dtype == old.dtype, i
        span = old.shape[2] if kind == "sliding" else keep
        want = old.clone()
        want[target, :, :span] = old[source, :, :span]  # (KVH, span, D)
        assert torch.equal(bits(new), bits(want)), f"KV tensor {i} ({kind}): not the source's bits, or more changed"
