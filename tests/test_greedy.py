"""contract.greedy: the softcap and greedy's argmax, as build and server both apply them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from contract.greedy import argmax, softcap
from gemma4_port.verify.reference import load_reference, reference_greedy
from runtime.model.loader import load_artifact
from support.rows import peaky

CAP = 30.0


@pytest.mark.parametrize("shift", [0.0, -60.0], ids=["positive max", "all negative"])
def test_bf16_argmax_is_the_float_argmax_first_index_on_ties(shift):
    row = (peaky(4) + shift).to(torch.bfloat16)
    row[[9, 70_000]] = row.max()  # a tie: the first index wins, as numpy's float argmax picks it
    assert argmax(row) == int(row.float().numpy().argmax()) == 9
    assert argmax(row.float()) == 9


def test_softcap_bounds_logits_and_keeps_their_order():
    row = torch.tensor([-500.0, -20.0, 0.0, 20.0, 500.0])
    capped = softcap(row, CAP)
    assert capped.abs().max() <= CAP and torch.all(capped[1:] > capped[:-1])
    np.testing.assert_allclose(softcap(row.numpy(), CAP), capped.numpy(), rtol=1e-6)
    assert softcap(row, None) is row


def test_device_argmax_without_cap_equals_reference_argmax_with_it(compiled):
    """No softcap in the graph: argmax is unchanged because the cap is monotonic."""
    model = load_artifact(compiled("tiny-12b", "fp32"))
    reference = load_reference(Path(model.meta.checkpoint))
    for golden in model.meta.golden:
        tokens, raw = model.runner.greedy(list(golden.ids), 4)
        ref_tokens, capped = reference_greedy(reference, list(golden.ids), 4)
        assert tokens == ref_tokens
        assert max(float(r.abs().max()) for r in raw) > 20  # raw logits run past where the cap bends
        assert all(int(r.argmax()) == int(c.argmax()) for r, c in zip(raw, capped))
