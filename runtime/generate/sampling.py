"""Sampling on the host: the last stage of choosing a token, small pure functions over one row of logits
(V,): temperature, min-p, top-k, top-p, then one seeded draw.

A row reaches here either raw from the device, with the softcap still to apply (`cap`: it is
monotonic, so greedy is the argmax of the raw row, and a sampled row folds it into its one weight
pass), or already capped and edited by runtime.generate.logits (`cap=None`), where a forbidden token
is -inf: its weight is exactly 0 and no step below can give it any. At the real vocabulary (262,144) every
full-vocabulary pass costs tens to hundreds of microseconds, so the work is ordered to touch the
whole row as few times as possible. Small steps run in numpy (a call costs ~1 us, a torch op ~5-15 us,
and torch's argmax over one row ~250 us); the two transcendental passes of an exact top-p use torch's
vectorised kernels."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from contract.greedy import argmax, softcap

# top-p without top-k: the nucleus is looked for among the 64 best tokens, then the 2,048 best (each
# costs less the fewer it ranks); only when their mass is below top_p does a full sort follow. Exact
# either way.
CANDIDATES = (64, 2048)
DRAW_BLOCK = 512
# A temperature below this samples greedily (vLLM's _SAMPLING_EPS in vllm/sampling_params.py): any other
# token's weight exp(-gap / t) is 0 in float32 there anyway, and from ~1e-8 down the scaled rows
# overflow or lose the max to rounding (NaN or wrong draws).
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # below GREEDY_BELOW (0 included) = greedy
    top_p: float = 1.0  # (0, 1]; 1 = off
    top_k: int = 0  # 0 = off
    min_p: float = 0.0  # [0, 1]; 0 = off

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


def row_weights(x: np.ndarray, cap: float | None, temperature: float) -> np.ndarray:
    """exp((softcap(x) - its max) / temperature) over a whole row, in a fresh float32 buffer: the
    softcap, the shift and the temperature in one chain of torch's vectorised kernels, then exp. In a
    row already capped (cap None) a -inf stays -inf, so its weight is exactly 0."""
    top = float(softcap(np.array([x.max()], dtype=np.float32), cap)[0])  # softcap is monotonic
    scaled = softcap(x, cap, 1.0 / temperature, -top / temperature)
    return torch.from_numpy(scaled).exp_().numpy()


def top_candidates(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest values of a row, descending, and their ids (exact; ties at the k-th value go
    either way).

    Ranking all 262,144 values costs ~0.8 ms. Instead: fold the row into >= 4k columns; each
    column maximum is a distinct element, so the k-th largest column maximum is a floor that no
    top-k value lies under, and only the few values above it are ranked. (At least 8,192 columns:
    numpy reduces many short columns twice as fast as a few long ones.)"""
    v = x.shape[0]
    fold = max(4 * k, 8192)
    if fold < v:
        columns = v // (v // fold)
        maxima = x[: v - v % columns].reshape(-1, columns).max(axis=0)  # (columns,)
        ids = np.flatnonzero(x >= np.partition(maxima, -k)[-k])
    else:
        ids = np.arange(v)
    if ids.size > k:
        ids = ids[np.argpartition(x[ids], -k)[-k:]]
    ids = ids[np.argsort(-x[ids], kind="stable")]
    return x[ids], ids


def nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Descending probabilities -> the shortest head whose mass reaches top_p (at least one token)."""
    before = np.cumsum(probs, dtype=np.float64) - probs  # mass ranked above each token (float64: long rows)
    return probs[: max(1, int((before < top_p).sum()))]


def min_p_keep(weights: np.ndarray, min_p: float) -> np.ndarray:
    """The positions vLLM's `min_p` keeps: a token whose probability is below min_p times the most
    likely token's is dropped. `weights` are proportional to the probabilities (after temperature)."""
    return np.flatnonzero(weights >= min_p * weights.max())


def draw(weights: np.ndarray, generator: torch.Generator) -> int:
    """An index drawn in proportion to non-negative weights with one seeded uniform: inverse CDF in
    two levels (blocks, then within the block), as a cumsum over the whole vocabulary costs ~1 ms."""
    starts = np.arange(0, weights.shape[0], DRAW_BLOCK)
    block_cdf = np.cumsum(np.add.reduceat(weights, starts), dtype=np.float64)
    u = float(torch.rand((), generator=generator, dtype=torch.float64)) * block_cdf[-1]
    b = min(int(np.searchsorted(block_cdf, u, side="right")), starts.size - 1)
    below = block_cdf[b - 1] if b else 0.0
    inner = np.cumsum(weights[starts[b] : starts[b] + DRAW_BLOCK], dtype=np.float64)
    # Rescale rather than subtract: the target stays strictly inside the block's own sum, so a
    # zero-weight token is never picked whatever the rounding of the block sums.
    target = (u - below) / (block_cdf[b] - below) * inner[-1]
    return int(starts[b]) + min(int(np.searchsorted(inner, target, side="right")), inner.size - 1)


def distribution(x: np.ndarray, params: SamplingParams, cap: float | None) -> tuple[np.ndarray, np.ndarray | None]:
    """The tokens a non-greedy draw may pick and their (unnormalised) weights: (softcap,) temperature,
    then min-p, top-k and top-p as vLLM's sampler orders them (min-p first, on the scaled row). Ids
    are None when every token of the row may be drawn (weights by position)."""
    if params.top_k:
        # top-k (then top-p) renormalises within the k best: no full-vocabulary pass is needed.
        values, ids = top_candidates(x, params.top_k)
        weights = row_weights(values, cap, params.temperature)
        if params.min_p:  # a threshold under the best token: it commutes with top-k
            kept = min_p_keep(weights, params.min_p)  # ascending positions of a descending row: still descending
            weights, ids = weights[kept], ids[kept]
        total = float(weights.sum(dtype=np.float64))
    elif params.min_p:
        # The few tokens min_p keeps are ranked directly; top-p then works on their renormalised mass.
        weights = row_weights(x, cap, params.temperature)
        ids = min_p_keep(weights, params.min_p)
        order = np.argsort(-weights[ids], kind="stable")
        weights, ids = weights[ids][order], ids[order]
        total = float(weights.sum(dtype=np.float64))
    else:
        weights = row_weights(x, cap, params.temperature)
        if params.top_p >= 1:
            return weights, None
        total = float(weights.sum())
        for k in (*CANDIDATES, weights.shape[0]):
            best, ids = top_candidates(weights, k)
            if best.sum() >= params.top_p * total:
                break
        weights = best
    if params.top_p < 1:
        weights = nucleus(weights / total, params.top_p)
        ids = ids[: weights.shape[0]]
    return weights, ids


def sample(
    row: torch.Tensor | np.ndarray, params: SamplingParams, cap: float | None, generator: torch.Generator
) -> int:
    """One token id from a row (V,): raw logits at the graph dtype with the softcap still to apply
    (`cap`), or a float32 row runtime.generate.logits capped and edited (cap None). Greedy is the
    row's argmax (of the raw row: the softcap is monotonic)."""
    if params.greedy:
        return argmax(row) if isinstance(row, torch.Tensor) else int(row.argmax())
    x = row if isinstance(row, np.ndarray) else row.float().numpy()
    weights, ids = distribution(x, params, cap)
    i = draw(weights, generator)
    return i if ids is None else int(ids[i])


def probabilities(row: torch.Tensor | np.ndarray, params: SamplingParams, cap: float | None) -> np.ndarray:
    """The distribution `sample` draws from, as a dense float64 row (V,) that sums to 1: a point mass
    at the argmax when greedy. What a speculative step compares a drafted token against."""
    v = row.shape[0]
    out = np.zeros(v, dtype=np.float64)
    if params.greedy:
        out[sample(row, params, cap, torch.Generator())] = 1.0  # greedy draws nothing from the generator
        return out
    weights, ids = distribution(row if isinstance(row, np.ndarray) else row.float().numpy(), params, cap)
    if ids is None:
        out[:] = weights
    else:
        out[ids] = weights
    out /= out.sum()
    return out
