"""Agreement between the artifact and the float reference: one rule for compile (which golden steps
the artifact reproduces) and verify (the verdict of each prompt)."""

from __future__ import annotations

from dataclasses import dataclass

from contract.greedy import softcap

# A divergence counts as a near-tie only when the device's own logit error at that step is a small
# fraction of the reference's logit range (garbage has errors as large as the range itself, so it
# never passes as a "tie") and the reference's gap between the two tokens is within twice that error.
NEAR_TIE_MAX_RELATIVE_ERROR = {"float32": 1e-3, "bfloat16": 0.08}


@dataclass
class Case:
    name: str
    ids: list[int]
    steps: int
    golden: tuple[int, ...] | None = None  # the artifact's self-test tokens, which must match too
    reused: int = 0  # leading positions kept from the slot's previous request, not prefilled again


@dataclass
class Row:
    case: Case
    compared: int
    first_divergence: int | None
    max_diff: float
    verdict: str  # MATCH | NEAR-TIE | MISMATCH
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict in ("MATCH", "NEAR-TIE")


def compare(case: Case, dev_tokens, dev_logits, ref_tokens, ref_logits, cap, dtype: str) -> Row:
    diffs = []
    first = None
    for i, (d, r) in enumerate(zip(dev_tokens, ref_tokens)):
        diffs.append(float((softcap(dev_logits[i], cap) - ref_logits[i]).abs().max()))
        if d != r:
            first = i
            break
    max_diff = max(diffs) if diffs else 0.0
    if first is None:
        if case.golden is not None and tuple(dev_tokens[:len(case.golden)]) != tuple(case.golden):
            return Row(case, len(dev_tokens), None, max_diff, "MISMATCH", "matches the live reference, not artifact.json")
        return Row(case, len(dev_tokens), None, max_diff, "MATCH")
    ref_step = ref_logits[first]
    gap = float(ref_step[ref_tokens[first]] - ref_step[dev_tokens[first]])
    err = diffs[-1]
    bound = NEAR_TIE_MAX_RELATIVE_ERROR[dtype] * float(ref_step.abs().max())
    if err <= bound and gap <= 2 * err:
        note = f"reference gap {gap:.3g} <= 2 x device error {err:.3g} (bound {bound:.3g}) at step {first}"
        return Row(case, first + 1, first, max_diff, "NEAR-TIE", note)
    return Row(case, first + 1, first, max_diff, "MISMATCH",
               f"device {dev_tokens[first]} vs reference {ref_tokens[first]} (gap {gap:.3g})")
