"""What the host does with a graph's raw logits that build and server must do alike: the softcap
Gemma-4 applies last (kept out of the device graph) and greedy's choice."""

from __future__ import annotations

import numpy as np
import torch


def softcap(logits, cap: float | None):
    """Gemma-4's final `tanh(x / cap) * cap` (torch or numpy), left out of the device graph: it is
    monotonic, so argmax is unchanged."""
    if not cap:
        return logits
    tanh = np.tanh if isinstance(logits, np.ndarray) else torch.tanh
    return tanh(logits / cap) * cap


def argmax(logits: torch.Tensor) -> int:
    """The first index of the largest raw logit (V,), float32 or bfloat16. A bf16 row is not converted:
    its bits read as int16 order the positive values as the floats do (one ~20 us pass instead of ~70)."""
    if logits.dtype == torch.bfloat16:
        bits = logits.view(torch.int16).numpy()
        best = int(bits.argmax())
        if bits[best] > 0:  # a positive maximum (NaN included, as numpy's float argmax would pick it)
            return best
    return int(logits.float().numpy().argmax())
