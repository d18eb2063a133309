"""gemma4_port.verify.agreement: when the artifact's tokens agree with the float reference's, for compile
and verify alike."""

import pytest
import torch

from gemma4_port.verify.agreement import Case, compare


def test_near_tie_rule():
    case = Case("x", [1], 3)
    ref = [torch.tensor([10.0, 9.99, 0.0])] * 3
    near = compare(case, [0, 1], [torch.tensor([10.0, 10.05, 0.0])] * 2, [0, 0, 0], ref, None, "bfloat16")
    assert near.verdict == "NEAR-TIE" and near.first_divergence == 1
    garbage = compare(case, [2], [torch.tensor([0.0, 0.0, 10.0])], [0, 0, 0], ref, None, "bfloat16")
    assert garbage.verdict == "MISMATCH"
    tight = compare(case, [1], [torch.tensor([10.0, 10.05, 0.0])], [0], ref, None, "float32")
    assert tight.verdict == "MISMATCH"  # float32 allows no such error


def test_a_logit_bent_without_a_token_flipped_fails_the_row():
    ref = [torch.tensor([10.0, 9.0, 0.0])] * 2
    bent = compare(Case("x", [1], 2), [0, 0], [torch.tensor([10.0, 9.01, 0.0])] * 2, [0, 0], ref, None, "float32")
    assert bent.verdict == "LOGITS" and "step 0: max |logit diff| 0.01 > 0.0005" in bent.note
    same = compare(Case("x", [1], 2), [0, 0], [torch.tensor([10.0, 9.0001, 0.0])] * 2, [0, 0], ref, None, "float32")
    assert same.verdict == "MATCH" and same.worst.max_abs == pytest.approx(1e-4, abs=1e-6)
