"""Robust summaries of noisy timings: medians and tail percentiles, never means alone."""

from __future__ import annotations

import numpy as np


def summary(samples, scale: float = 1.0) -> dict[str, float]:
    """p50 / p99 / min / n of `samples` multiplied by `scale` (e.g. 1e6 for seconds -> us)."""
    a = np.asarray(list(samples), dtype=float) * scale
    if a.size == 0:
        return {"p50": float("nan"), "p99": float("nan"), "min": float("nan"), "n": 0}
    return {
        "p50": float(np.percentile(a, 50)),
        "p99": float(np.percentile(a, 99)),
        "min": float(a.min()),
        "n": int(a.size),
    }


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")
