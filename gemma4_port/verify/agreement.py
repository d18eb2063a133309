"""Agreement between the artifact and the float reference, one prompt at a time: every compared step
bounded (runtime-shared bounds in contract.logit_error), the verdict and its reason."""

from __future__ import annotations

from dataclasses import dataclass, field

from contract.artifact import Golden
from contract.logit_error import BOUNDS, StepStats, judge_golden, step_stats, worst


@dataclass
class Case:
    name: str
    ids: list[int]
    steps: int
    golden: Golden | None = None  # artifact.json's reference steps: the live reference must agree, the device pass
    reused: int = 0  # leading positions kept from the slot's previous request, not prefilled again
    media: tuple = ()  # the prompt's images (runtime.model.media.MediaInput), in order


@dataclass
class Row:
    case: Case
    compared: int
    first_divergence: int | None
    verdict: str  # MATCH | NEAR-TIE | MISMATCH | LOGITS (tokens agree, logits beyond the bounds)
    note: str = ""
    stats: list[StepStats] = field(default_factory=list)  # one per compared step
    tokens: list[tuple[int, int]] = field(default_factory=list)  # (device, reference) per compared step

    @property
    def ok(self) -> bool:
        return self.verdict in ("MATCH", "NEAR-TIE")

    @property
    def worst(self) -> StepStats | None:
        return worst(self.stats)


def compare(case: Case, dev_tokens, dev_logits, ref_tokens, ref_logits, cap, dtype: str) -> Row:
    """Every step up to the first divergence (included) is bounded, whether or not the tokens match:
    a graph that bends the logits without flipping a short greedy run fails here. A divergence
    within the bounds is a near-tie: both tokens' errors are bounded, so the reference's gap between
    them is at most twice the bound."""
    bounds = BOUNDS[dtype]
    stats, pairs, first = [], [], None
    for i, (d, r) in enumerate(zip(dev_tokens, ref_tokens)):
        stats.append(step_stats(dev_logits[i], ref_logits[i], cap))
        pairs.append((d, r))
        if d != r:
            first = i
            break
    row = Row(case, len(stats), first, "MATCH", stats=stats, tokens=pairs)
    broken = next(((i, why) for i, s in enumerate(stats) if (why := bounds.exceeded(s))), None)
    if broken:
        i, why = broken
        where = (
            "" if first is None else f"; device {dev_tokens[first]} vs reference {ref_tokens[first]} at step {first}"
        )
        row.verdict, row.note = ("LOGITS" if first is None else "MISMATCH"), f"step {i}: {why} ({dtype} bound){where}"
    elif first is not None:
        gap = float(ref_logits[first][ref_tokens[first]] - ref_logits[first][dev_tokens[first]])
        row.verdict, row.note = (
            "NEAR-TIE",
            f"reference gap {gap:.3g} at step {first}, every step within the {dtype} bounds",
        )
    elif case.golden is not None:
        if tuple(ref_tokens) != case.golden.tokens:
            row.verdict, row.note = "MISMATCH", "artifact.json's golden tokens are not the live reference's"
        elif problem := judge_golden(case.golden, dev_tokens, dev_logits, cap, dtype)[1]:
            row.verdict, row.note = "MISMATCH", f"the server's self-test fails: {problem}"
    return row
