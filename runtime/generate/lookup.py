"""Prompt lookup: drafting without a drafter, from the choice's own tokens (prompt and output so far).

When the last n tokens (n from `max_n` down to `min_n`) occurred earlier, the tokens that followed
them there are the draft. A coding agent asking for an edit gets most of its input back, a chat quotes
its context: such drafts are often right, and cost no weights and no device time. The draft is a
deterministic function of the tokens, so the acceptance rule treats it as a point mass
(runtime.generate.acceptance). Pure: numpy over one buffer per choice."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class Context:
    """A choice's tokens so far (prompt, then each generated one), in a buffer that grows by doubling."""

    def __init__(self, tokens: Iterable[int] = ()):
        first = np.fromiter(tokens, dtype=np.int64)
        self._buf = np.empty(max(64, 2 * first.size), dtype=np.int64)
        self._buf[: first.size] = first
        self.size = first.size

    def append(self, token: int) -> None:
        if self.size == self._buf.size:
            self._buf = np.concatenate([self._buf, np.empty_like(self._buf)])
        self._buf[self.size] = token
        self.size += 1

    @property
    def tokens(self) -> np.ndarray:
        return self._buf[: self.size]


def propose(tokens: np.ndarray, k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k tokens that followed an earlier occurrence of the longest suffix of `tokens` of n tokens,
    min_n <= n <= max_n, that did occur before; [] when none did. Of the occurrences of that suffix the
    latest that is followed by k tokens (the freshest context), else the earliest (the longest draft)."""
    size = tokens.shape[0]
    if k < 1:
        return []
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = tokens[size - n :]
        # Starts s of earlier occurrences, each followed by at least one token: s + n <= size - 1.
        starts = np.flatnonzero(tokens[: size - n] == suffix[0])
        for j in range(1, n):
            starts = starts[tokens[starts + j] == suffix[j]]
        if starts.size:
            full = starts[starts + n + k <= size]
            s = int(full[-1] if full.size else starts[0])
            return tokens[s + n : s + n + k].tolist()
    return []
