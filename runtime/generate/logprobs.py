"""The logprobs a client asks for: those of the model's own distribution, `log_softmax(softcap(raw
logits))`, before temperature, penalties, bias and the grammar mask, as vLLM's default
(`raw_logprobs`) reports them. One transcendental pass over the row for the normaliser, then only the
named ids."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from contract.greedy import softcap
from runtime.generate.sampling import row_weights, top_candidates


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float | None  # None: nothing predicts it (a prompt's first token)
    top: tuple[tuple[int, float], ...]  # the most likely ids and their logprobs, best first
    rank: int | None = None  # 1 + how many ids are likelier (asked for a prompt's tokens, as vLLM reports them)


def logprobs(logits: torch.Tensor, token: int, k: int, cap: float | None) -> TokenLogprob:
    """The chosen token's logprob and the k best, under log_softmax(softcap(raw))."""
    return _logprobs_of_row(logits.float().numpy(), token, k, cap)


def prompt_logprob(logits: torch.Tensor, token: int, k: int, cap: float | None) -> TokenLogprob:
    """`logprobs` of a prompt token under the logits of the positions before it, with its rank (one more
    comparison pass; the softcap is monotonic, so the raw row ranks as the capped one)."""
    x = logits.float().numpy()
    return _logprobs_of_row(x, token, k, cap, rank=1 + int(np.count_nonzero(x > x[token])))


def _logprobs_of_row(x: np.ndarray, token: int, k: int, cap: float | None, rank: int | None = None) -> TokenLogprob:
    """`logprobs` of a raw row already in float32 (converting a 262,144-wide bf16 row costs ~50 us)."""
    top = float(x.max())
    log_total = math.log(float(row_weights(x, cap, 1.0).sum(dtype=np.float64)))
    shift = float(softcap(np.array([top], dtype=np.float32), cap)[0]) + log_total

    def lp(values: np.ndarray) -> np.ndarray:
        return softcap(values.astype(np.float32), cap) - shift

    best: tuple[tuple[int, float], ...] = ()
    if k:
        values, ids = top_candidates(x, k)
        best = tuple(zip(ids.tolist(), lp(values).tolist(), strict=True))
    # A token among the best takes that very number: a harness compares them for equality (is it greedy?)
    own = dict(best).get(token)
    return TokenLogprob(token, float(lp(x[token : token + 1])[0]) if own is None else own, best, rank)
