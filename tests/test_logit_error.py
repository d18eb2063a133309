"""The logit figures and the golden-step rule the server's self-test applies (runtime/logit_error.py)."""

import pytest
import torch

from contract.artifact import Golden, GoldenStep
from contract.logit_error import GOLDEN_TOP, golden_steps, judge_golden, step_stats


def test_step_figures():
    ref = torch.randn(50, generator=torch.Generator().manual_seed(1)) * 5
    exact = step_stats(ref, ref, None)
    assert (exact.max_abs, exact.kl, exact.topk) == (0.0, 0.0, 1.0) and exact.cosine == pytest.approx(1.0)
    flipped = step_stats(-ref, ref, None)
    assert flipped.cosine == pytest.approx(-1.0) and flipped.topk == 0.0 and flipped.kl > 1.0
    capped = step_stats(ref * 10, torch.tanh(ref * 10 / 30) * 30, 30.0)  # the softcap is applied to the device row
    assert capped.max_abs < 1e-5  # float32 rounding of the reference row


REF = [
    torch.tensor([5.0, 4.99, 1.0, 0.5, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0]),
    torch.tensor([0.0, 1.0, 9.0, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0]),
]


def golden() -> Golden:
    """Two reference steps as compile stores them: a near-tie (tokens 0 and 1), then a clear choice (2)."""
    steps = tuple(GoldenStep(ids=ids, logits=values) for ids, values in golden_steps(REF))
    return Golden(name="g", ids=(1, 2), tokens=(0, 2), steps=steps)


def test_compile_stores_the_best_tokens_best_first():
    steps = golden().steps
    assert [len(s.ids) for s in steps] == [GOLDEN_TOP] * 2 and steps[0].ids[:2] == (0, 1) and steps[1].ids[0] == 2
    assert steps[0].logits[0] - steps[0].logits[1] == pytest.approx(0.01, abs=1e-6)


def test_the_reference_run_passes_every_step():
    assert judge_golden(golden(), [0, 2], REF, None, "float32") == (2, None)


def test_a_bf16_near_tie_passes_and_ends_the_judged_steps():
    """Luck: the device's bf16 error tips the 0.01 gap the other way; the next step is not judged."""
    device = [REF[0] + torch.tensor([0.0, 0.02] + [0.0] * 8), torch.zeros(10)]
    assert judge_golden(golden(), [1, 7], device, None, "bfloat16") == (1, None)


def test_float32_allows_no_such_error():
    device = [REF[0] + torch.tensor([0.0, 0.02] + [0.0] * 8), REF[1]]
    steps, problem = judge_golden(golden(), [1, 2], device, None, "float32")
    assert steps == 1 and "off by 0.02, more than the float32 bound" in problem


def test_garbage_fails_even_where_it_picks_the_reference_token():
    device = [torch.tensor([20.0, -10.0, 10.0, -10.0, 10.0, -10.0, 10.0, -10.0, 10.0, -10.0]), REF[1]]
    assert int(device[0].argmax()) == 0  # the right token, by luck
    steps, problem = judge_golden(golden(), [0, 2], device, None, "bfloat16")
    assert steps == 1 and "more than the bfloat16 bound" in problem


def test_a_divergence_outside_the_reference_best_tokens_is_not_a_near_tie():
    device = [REF[0], REF[1].clone()]
    device[1][9] = 9.5  # token 9: not among the reference's best 8, whose logits are all exact
    steps, problem = judge_golden(golden(), [0, 9], device, None, "bfloat16")
    assert steps == 2 and "not among its best 8: not a near-tie" in problem


def test_a_divergence_across_a_wide_gap_is_not_a_near_tie():
    wide = Golden(name="g", ids=(1,), tokens=(0,), steps=(GoldenStep(ids=(0, 1), logits=(20.0, 9.0)),))
    device = [torch.tensor([16.5, 12.5])]  # each within the bf16 bound of 4, the choice flipped: gap 11 > 8
    steps, problem = judge_golden(wide, [1], device, None, "bfloat16")
    assert steps == 1 and "gap of 11" in problem and "not a near-tie" in problem


def test_a_golden_token_that_is_not_its_steps_best_is_refused():
    bad = golden().model_copy(update={"tokens": (1, 2)})
    assert "is not its reference's best, 0" in judge_golden(bad, [0, 2], REF, None, "float32")[1]
