"""Sampling on the host: small pure functions over one row of raw logits."""

from __future__ import annotations

import torch


def softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """Gemma-4's final `tanh(x / cap) * cap`, left out of the device graph (monotonic: argmax is unchanged)."""
    if not cap:
        return logits
    return torch.tanh(logits / cap) * cap
