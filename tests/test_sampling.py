"""Host sampling against a plain full-sort reference, at the real vocabulary size."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from contract.greedy import argmax, softcap
from runtime.generate.sampling import (
    GREEDY_BELOW,
    SamplingParams,
    distribution,
    draw,
    min_p_keep,
    nucleus,
    sample,
    top_candidates,
)
from support.rows import V, peaky

CAP = 30.0


def reference(logits: torch.Tensor, p: SamplingParams, cap: float | None) -> dict[int, float]:
    """The textbook order in float64 with a full sort: softcap, temperature, top-k, top-p."""
    probs = torch.softmax(softcap(logits.double(), cap) / p.temperature, 0)
    values, ids = torch.sort(probs, descending=True, stable=True)
    if p.top_k:
        values, ids = values[: p.top_k], ids[: p.top_k]
    values = values / values.sum()
    if p.top_p < 1:
        keep = max(1, int(((torch.cumsum(values, 0) - values) < p.top_p).sum()))
        values, ids = values[:keep], ids[:keep]
    values = values / values.sum()
    return dict(zip(ids.tolist(), values.tolist()))


def as_dict(weights: np.ndarray, ids: np.ndarray | None) -> dict[int, float]:
    ids = np.arange(weights.shape[0]) if ids is None else ids
    total = weights.sum(dtype=np.float64)
    return dict(zip(ids.tolist(), (weights / total).tolist()))


def flat(seed: int) -> torch.Tensor:
    """Mass spread thin: the best 2048 tokens hold far less than top_p (the full-sort fallback)."""
    return torch.randn(V, generator=torch.Generator().manual_seed(seed)) * 0.5


@pytest.mark.parametrize("row", [peaky(0), flat(1)], ids=["peaky", "flat"])
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, top_p=0.9),
        SamplingParams(temperature=1.3, top_k=50),
        SamplingParams(temperature=0.8, top_p=0.95, top_k=40),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=1.0, top_p=0.5, top_k=V + 5),
    ],
    ids=["top_p", "top_k", "top_k+top_p", "temperature", "top_k>V"],
)
def test_distribution_equals_full_sort_reference(row, params):
    got = as_dict(*distribution(row.numpy(), params, CAP))
    want = reference(row, params, CAP)
    assert got.keys() == want.keys()
    ids = list(want)
    np.testing.assert_allclose([got[i] for i in ids], [want[i] for i in ids], rtol=2e-4, atol=1e-9)


def test_flat_row_really_takes_the_fallback():
    weights, ids = distribution(flat(1).numpy(), SamplingParams(temperature=0.7, top_p=0.9), CAP)
    assert ids.shape[0] > 2048  # more tokens than the candidate pass ranks: the full sort ran


@pytest.mark.parametrize("k", [1, 7, 50, 2048, 70_000, V])
def test_top_candidates_is_exact(k):
    row = peaky(k).numpy()
    values, ids = top_candidates(row, k)
    want_values, want_ids = torch.topk(torch.from_numpy(row), k)
    np.testing.assert_array_equal(values, want_values.numpy())
    assert set(ids.tolist()) == set(want_ids.tolist())
    np.testing.assert_array_equal(row[ids], values)


def test_top_candidates_with_ties_returns_k_of_the_best():
    row = np.zeros(V, dtype=np.float32)
    row[::1000] = 5.0  # 263 tied maxima
    values, ids = top_candidates(row, 50)
    assert len(ids) == 50 and (values == 5.0).all() and (ids % 1000 == 0).all()


def test_greedy_is_the_argmax_of_raw_and_of_softcapped_logits():
    row = peaky(3)
    token = sample(row, SamplingParams(temperature=0), CAP, torch.Generator())
    assert token == int(row.argmax()) == int(softcap(row, CAP).argmax())


def test_nucleus_keeps_the_shortest_head_reaching_top_p():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    assert nucleus(probs, 0.5).tolist() == [0.5]
    assert nucleus(probs, 0.51).tolist() == [0.5, 0.3]
    assert nucleus(probs, 0.8).tolist() == [0.5, 0.3]
    assert nucleus(probs, 0.99).tolist() == [0.5, 0.3, 0.15, 0.05]
    assert nucleus(probs, 1e-9).tolist() == [0.5]


def test_draw_follows_the_weights_and_never_picks_a_zero():
    weights = np.zeros(1500, dtype=np.float32)  # spans three draw blocks
    weights[[3, 700, 1499]] = [1.0, 2.0, 1.0]
    g = torch.Generator().manual_seed(0)
    counts = np.bincount([draw(weights, g) for _ in range(4000)], minlength=1500)
    assert set(np.flatnonzero(counts)) == {3, 700, 1499}
    np.testing.assert_allclose(counts[[3, 700, 1499]] / 4000, [0.25, 0.5, 0.25], atol=0.03)


def test_same_seed_same_tokens_and_seeds_matter():
    row = flat(2)
    params = SamplingParams(temperature=1.0, top_p=0.9)

    def run(seed):
        g = torch.Generator().manual_seed(seed)
        return [sample(row, params, CAP, g) for _ in range(5)]

    assert run(7) == run(7)
    assert len({tuple(run(s)) for s in range(4)}) > 1


def test_sampled_frequencies_match_the_reference():
    row = torch.tensor([4.0, 3.0, 2.5, 1.0, 0.0, -1.0, -3.0, -9.0])
    params = SamplingParams(temperature=0.9, top_p=0.9, top_k=6)
    want = reference(row, params, CAP)
    g = torch.Generator().manual_seed(1)
    n = 6000
    counts = np.bincount([sample(row, params, CAP, g) for _ in range(n)], minlength=8) / n
    assert set(np.flatnonzero(counts)) == set(want)
    np.testing.assert_allclose([counts[i] for i in want], list(want.values()), atol=0.025)


@pytest.mark.parametrize("temperature", [GREEDY_BELOW * 0.999, 1e-8, 1e-10, 1e-20, 1e-40, 5e-324])
@pytest.mark.parametrize("extra", [{}, {"top_k": 40}, {"top_p": 0.9}], ids=["temperature", "top_k", "top_p"])
def test_a_tiny_temperature_is_greedy(temperature, extra):
    """At 1e-10 and below the scaled weights overflowed: 106 of 160 draws differed from greedy."""
    g = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=temperature, **extra)
    for seed in range(8):
        row = peaky(seed)
        for cap in (CAP, None):
            assert sample(row, params, cap, g) == argmax(row)


@pytest.mark.parametrize("extra", [{}, {"top_k": 40}, {"top_p": 0.9}], ids=["temperature", "top_k", "top_p"])
def test_the_smallest_sampled_temperature_gives_finite_weights(extra):
    params = SamplingParams(temperature=GREEDY_BELOW, **extra)
    assert not params.greedy
    for seed in range(4):
        for cap in (CAP, None):
            weights, _ = distribution(peaky(seed).numpy(), params, cap)
            assert np.isfinite(weights).all() and weights.max() > 0


@pytest.mark.parametrize("min_p", [0.0, 0.05, 0.5, 1.0])
def test_min_p_keeps_exactly_the_tokens_at_least_min_p_times_the_best(min_p):
    """vLLM's definition: after temperature, a token with prob < min_p * max prob is dropped."""
    probs = torch.softmax(peaky(3).double() / 0.8, 0).numpy()
    kept = set(min_p_keep(probs / probs.sum() * 7.0, min_p).tolist())  # any scale of the probabilities
    assert kept == set(np.flatnonzero(probs >= min_p * probs.max()).tolist()) and int(probs.argmax()) in kept


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.9, min_p=0.05),
        SamplingParams(temperature=1.2, min_p=0.1, top_k=20),
        SamplingParams(temperature=1.0, min_p=0.02, top_p=0.8),
        SamplingParams(temperature=1.0, min_p=1.0),
    ],
    ids=["min_p", "min_p+top_k", "min_p+top_p", "min_p=1"],
)
def test_min_p_distribution_equals_the_reference(params):
    """min-p before top-k and top-p (vLLM's order: v1/sample/sampler.py applies it with the
    argmax-invariant processors, between temperature and top-k/top-p)."""
    row = peaky(4)
    probs = torch.softmax(softcap(row.double(), CAP) / params.temperature, 0)
    survivors = torch.where(probs >= params.min_p * probs.max(), probs, torch.zeros_like(probs))
    want = reference(torch.log(survivors), dataclasses.replace(params, temperature=1.0), None)
    want = {i: p for i, p in want.items() if p > 0}
    got = as_dict(*distribution(row.numpy(), params, CAP))
    assert got.keys() == want.keys() and len(want) >= 1
    ids = list(want)
    np.testing.assert_allclose([got[i] for i in ids], [want[i] for i in ids], rtol=2e-4, atol=1e-9)
    assert params.min_p < 1 or len(want) == 1  # min_p = 1 keeps only the best token
