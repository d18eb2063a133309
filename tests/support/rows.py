"""Logit rows shaped like a real LM's, at the real vocabulary size."""

from __future__ import annotations

import torch

V = 262_144


def peaky(seed: int) -> torch.Tensor:
    """Like a real LM row: a broad floor and a few dozen strong candidates (softcap bites above 30)."""
    g = torch.Generator().manual_seed(seed)
    row = torch.randn(V, generator=g) * 3
    row[torch.randint(0, V, (40,), generator=g)] += torch.rand(40, generator=g) * 45
    return row
