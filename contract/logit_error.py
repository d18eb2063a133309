"""How far a device's logits may be from the float reference's: the figures, their bounds per
dtype, and the golden-step rule the server's self-test applies with data stored at compile time.

Each figure sees a different fault: the largest absolute error (any bent logit, in softcapped
units), the cosine of the two logit vectors (a drift spread over the vocabulary), the KL
divergence of the two softmax distributions (what sampling would feel) and the overlap of the two
top-k sets (what a user would see first). `build.py verify` bounds all four at every compared
step; the self-test, which has only the reference's best tokens per golden step, bounds the error
on those."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from contract.greedy import softcap

TOP_K = 10  # the overlap figure's k
GOLDEN_TOP = 8  # reference tokens stored per golden step: a near-tie's runner-up is among them


@dataclass(frozen=True)
class StepStats:
    max_abs: float  # max |softcap(device) - reference| over the vocabulary
    cosine: float  # cosine similarity of the softcapped logit vectors
    kl: float  # KL(reference || device) of the softmax distributions, in nats
    topk: float  # |top-k(device) & top-k(reference)| / k

    def as_dict(self) -> dict:
        return asdict(self)


def step_stats(device_raw: torch.Tensor, reference: torch.Tensor, cap: float | None) -> StepStats:
    """device_raw (V,) raw logits from the graph; reference (V,) the reference's softcapped logits."""
    dev = softcap(device_raw.double(), cap)
    ref = reference.double()
    k = min(TOP_K, ref.numel())
    shared = set(dev.topk(k).indices.tolist()) & set(ref.topk(k).indices.tolist())
    log_ref, log_dev = torch.log_softmax(ref, -1), torch.log_softmax(dev, -1)
    return StepStats(
        max_abs=float((dev - ref).abs().max()),
        cosine=float(torch.nn.functional.cosine_similarity(dev, ref, dim=0)),
        kl=max(0.0, float((log_ref.exp() * (log_ref - log_dev)).sum())),
        topk=len(shared) / k,
    )


def worst(stats: list[StepStats]) -> StepStats | None:
    """Each figure at its worst over the steps (the steps may differ per figure)."""
    if not stats:
        return None
    return StepStats(
        max(s.max_abs for s in stats),
        min(s.cosine for s in stats),
        max(s.kl for s in stats),
        min(s.topk for s in stats),
    )


@dataclass(frozen=True)
class Bounds:
    """The most a correct artifact of one dtype may differ from the float reference at any step."""

    max_abs: float
    one_minus_cosine: float
    kl: float
    topk: float  # the least overlap

    def exceeded(self, s: StepStats) -> str | None:
        """What the step breaks, or None."""
        over = [
            (s.max_abs > self.max_abs, f"max |logit diff| {s.max_abs:.3g} > {self.max_abs:g}"),
            (1 - s.cosine > self.one_minus_cosine, f"1 - cosine {1 - s.cosine:.3g} > {self.one_minus_cosine:g}"),
            (s.kl > self.kl, f"KL {s.kl:.3g} > {self.kl:g}"),
            (s.topk < self.topk, f"top-{TOP_K} overlap {s.topk:.2f} < {self.topk:g}"),
        ]
        broken = [text for bad, text in over if bad]
        return ", ".join(broken) or None


# Set from `build.py verify --json` of the correct tiny-e2b, tiny-e4b and tiny-12b artifacts (tp 1
# and 2, batch 1 and 4), at the worst step over every prompt, and checked against the same artifacts
# with one bug planted. 1 - cosine and KL grow with the square of the error, so their factor is the
# square of max_abs's. Measured again with the chat-protocol test models and the long-prompt rows:
# float32 at most 8.3e-5 (batch 4), bf16 at most 1.5, both inside the figures below.
BOUNDS = {
    # float32, correct: max_abs 1.13e-4 (tiny-e4b; tiny-e2b 3.7e-5, tiny-12b 1.8e-5, tp 2 at most
    # 1.0e-4), 1 - cosine 9.7e-12, KL 1.9e-10, top-10 overlap 1.0. Bounds 4.4x above (19x for the
    # squares). Planted, all of which matched token for token: the global rotary 3% off (max_abs
    # 1.6-6.3), the final norm in bf16 (0.087-0.099), the PLE mix without its 2**-0.5 (1.3e-3 on
    # tiny-e2b, 2.6x the bound, 0.026 on tiny-e4b). Top-10 allows one swap at the edge, a tie at 1e-4.
    "float32": Bounds(max_abs=5e-4, one_minus_cosine=2e-10, kl=4e-9, topk=0.9),
    # bfloat16, correct: max_abs 1.99 (tiny-e4b; tiny-e2b 1.18, tiny-12b 0.62), 1 - cosine 2.0e-3,
    # KL 0.051, top-10 overlap 0.7. Bounds twice that (four times for the squares); transformers' own
    # bf16 run of tiny-e4b reaches 6.9 at one step, so a step alone cannot judge finer. Garbage
    # (max_abs 34-39, 1 - cosine 0.8-1.2, KL 16-24, overlap 0-0.1) fails at every row; drift that
    # hides in bf16's noise step by step is judged over all steps by verify (BF16_NOISE_RATIO).
    "bfloat16": Bounds(max_abs=4.0, one_minus_cosine=8e-3, kl=0.2, topk=0.5),
}


def golden_steps(reference: list[torch.Tensor]) -> list[tuple[list[int], list[float]]]:
    """What compile stores per golden step: the reference's GOLDEN_TOP best tokens and their logits."""
    out = []
    for row in reference:
        top = row.float().topk(min(GOLDEN_TOP, row.numel()))
        out.append((top.indices.tolist(), top.values.tolist()))
    return out


def judge_golden(
    golden, tokens: list[int], raw_logits: list[torch.Tensor], cap: float | None, dtype: str
) -> tuple[int, str | None]:
    """A device run of a golden prompt against the reference steps stored at compile time: the steps
    it was judged on, and why it fails (None if it passes).

    At every step the device's logits for the reference's best tokens must be within the dtype's
    bound, so garbage fails even where it picks the right token. A different token passes only as a
    near-tie: it is among those best tokens, whose errors are then bounded, so the reference's gap
    between the two is at most twice the bound. The steps after it follow another prefix and are
    not judged."""
    bound = BOUNDS[dtype].max_abs
    for i, (token, raw, want, step) in enumerate(zip(tokens, raw_logits, golden.tokens, golden.steps)):
        if step.ids[0] != want:
            return i + 1, f"step {i}: artifact.json's golden token {want} is not its reference's best, {step.ids[0]}"
        dev = softcap(raw.double()[list(step.ids)], cap)
        err = float((dev - torch.tensor(step.logits, dtype=torch.float64)).abs().max())
        if err > bound:
            return i + 1, (
                f"step {i}: the logits of the reference's best {len(step.ids)} tokens are off by "
                f"{err:.3g}, more than the {dtype} bound {bound:g}"
            )
        if token != want:
            if token not in step.ids:
                return i + 1, (
                    f"step {i}: token {token}, the reference's is {want}, and {token} is not among its "
                    f"best {len(step.ids)}: not a near-tie"
                )
            gap = step.logits[0] - step.logits[step.ids.index(token)]
            if gap > 2 * bound:
                return i + 1, (
                    f"step {i}: token {token}, the reference's is {want} by a gap of {gap:.3g}, more "
                    f"than twice the {dtype} bound {bound:g}: not a near-tie"
                )
            return i + 1, None
    return min(len(tokens), len(golden.steps)), None
