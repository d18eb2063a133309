"""A prompt's prefill plan: its positions as chunks of the prefill buckets, never cutting a block of
soft tokens that see each other both ways. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.model.media import MediaError


def chunks(
    start: int, end: int, buckets: tuple[int, ...], whole: Sequence[tuple[int, int]] = ()
) -> list[tuple[int, int, int]]:
    """Positions start .. end-1 of a prompt as prefill chunks (start, length, bucket): chunks of the
    largest bucket, then the rest in the smallest bucket that holds it. A chunk never ends inside a
    block of `whole` (its queries see the block's later keys, which must be in the cache with them):
    its end moves back to the block's start, so the block is in the next chunk whole."""
    out, big = [], buckets[-1]
    while start < end:
        n = min(big, end - start)
        for a, b in whole:
            if a < start + n < b:
                if a <= start:
                    raise MediaError(f"a block of {b - a} soft tokens does not fit the largest prefill bucket ({big})")
                n = a - start
        out.append((start, n, next(b for b in buckets if n <= b)))
        start += n
    return out
