"""gemma4_port.agreement: when the artifact's tokens agree with the float reference's, for compile
and verify alike."""

import torch

from gemma4_port.agreement import Case, compare


def test_near_tie_rule():
    case = Case("x", [1], 3)
    ref = [torch.tensor([10.0, 9.99, 0.0])] * 3
    near = compare(case, [0, 1], [torch.tensor([10.0, 10.05, 0.0])] * 2, [0, 0, 0], ref, None, "bfloat16")
    assert near.verdict == "NEAR-TIE" and near.first_divergence == 1
    garbage = compare(case, [2], [torch.tensor([0.0, 0.0, 10.0])], [0, 0, 0], ref, None, "bfloat16")
    assert garbage.verdict == "MISMATCH"
    tight = compare(case, [1], [torch.tensor([10.0, 10.05, 0.0])], [0], ref, None, "float32")
    assert tight.verdict == "MISMATCH"  # float32 allows no such error
