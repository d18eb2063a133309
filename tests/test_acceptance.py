"""runtime.generate.acceptance: speculative decoding keeps the target's distribution (chi-square on a
small vocabulary at fixed seeds, the same test rejecting the drafter's own distribution), and greedy
speculation is token for token greedy decoding, under penalties and a grammar, on a toy model."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

from runtime.generate.acceptance import Draft, accept_or_resample, judge
from runtime.generate.drafts import DrafterDraft, lookup_draft
from runtime.generate.logits import Controls, TokenChooser
from runtime.generate.lookup import Context
from runtime.generate.sampling import SamplingParams, draw, probabilities

V, CAP = 8, 30.0
EOS = (0,)
GREEDY = SamplingParams(temperature=0.0)
TRIALS = 3_000


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, float]:
    """Pearson's statistic of `counts` against `probs` (cells expecting fewer than 5 pooled), and its
    99.9 % quantile under the null (Wilson-Hilferty). A cell of probability 0 must be empty."""
    assert not counts[probs == 0].any(), "a token of probability 0 was generated"
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    df = exp.size - 1
    bound = df * (1 - 2 / (9 * df) + 3.09 * math.sqrt(2 / (9 * df))) ** 3
    return float(((obs - exp) ** 2 / exp).sum()), bound


def toy(context: list[int], seed: int = 0, scale: float = 2.0) -> torch.Tensor:
    """A toy language model: the logits after `context` depend on its last two tokens only (so greedy
    decoding falls into cycles prompt lookup can draft from); it ends (EOS) rarely."""
    return _toy(tuple(context[-2:]), seed, scale)


@functools.cache
def _toy(last: tuple[int, ...], seed: int, scale: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(hash((seed, *last)) % 2**62)
    row = torch.randn(V, generator=g) * scale
    row[EOS[0]] -= 3.0
    return row


def draft_toy(context: list[int]) -> torch.Tensor:
    """A drafter for the toy model: its logits, noisy."""
    return toy(context) + toy(context, seed=1, scale=1.5)


def rows_after(context: list[int], draft: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """What a verify step returns (len(draft) + 1, V): the logits after the context and each drafted token."""
    return torch.stack([toy(context + list(draft[:i]), seed) for i in range(len(draft) + 1)])


class NoRepeat:
    """A grammar matcher's interface whose mask depends on what it took (no token twice in a row),
    with rollback: the state a real grammar has, at a vocabulary of 8."""

    finished = False

    def __init__(self):
        self.taken: list[int] = []

    def mask(self, x: np.ndarray) -> np.ndarray:
        if self.taken:
            x[self.taken[-1]] = -np.inf
        return x

    def accept(self, token: int) -> None:
        assert not self.taken or token != self.taken[-1], "a masked token was generated"
        self.taken.append(token)

    def rollback(self, n: int) -> None:
        del self.taken[len(self.taken) - n :]


def chooser(controls: Controls | None = None, grammar: bool = False) -> TokenChooser:
    return TokenChooser(controls or Controls(), [3, 4], EOS, NoRepeat() if grammar else None)  # type: ignore[arg-type]


def drafter_draft(c: TokenChooser, context: list[int], k: int, params: SamplingParams, gen) -> Draft:
    """A draft of k tokens from a second toy model (the drafter), drawn inside the chooser's trial."""
    drafting = DrafterDraft(c, params, CAP, gen)
    with c.trial():
        while len(drafting.tokens) < k and not drafting.done:
            drafting.step(draft_toy(context + drafting.tokens))
    return drafting.draft()


SAMPLED = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.8, min_p=0.05),
]


@pytest.mark.parametrize(
    "drafter,params", [("lookup", SAMPLED[0]), ("lookup", SAMPLED[2]), ("drafter", SAMPLED[1]), ("drafter", SAMPLED[2])]
)
def test_the_first_token_is_distributed_as_the_target(params, drafter):
    """One drafted token against one target row: a point mass (prompt lookup proposes the target's
    second most likely token) or a draw from another model's distribution (the rejection rule)."""
    gen = torch.Generator().manual_seed(7)
    controls = Controls(logit_bias=((2, 1.5),), presence_penalty=0.5)
    rows = rows_after([3, 4], (5,))
    p = probabilities(chooser(controls).allowed_row(rows[0], CAP), params, None)
    second = int(np.argsort(-p)[1])
    counts, drafted = np.zeros(V, dtype=np.int64), np.zeros(V, dtype=np.int64)
    for _ in range(TRIALS):
        c = chooser(controls)
        draft = Draft((second,)) if drafter == "lookup" else drafter_draft(c, [3, 4], 1, params, gen)
        verdict = judge(rows_after([3, 4], draft.tokens), draft, c, params, CAP, gen)
        counts[verdict.tokens[0]] += 1
        drafted[draft.tokens[0]] += 1
    stat, bound = chi_square(counts, p)
    assert stat < bound, (stat, bound, counts, p)
    if drafter == "drafter":  # the drafts themselves are far from p: acceptance did the work
        assert np.abs(drafted / TRIALS - p).sum() > 0.2


@pytest.mark.parametrize("params", SAMPLED[2:])
def test_the_first_three_tokens_are_jointly_distributed_as_the_target_under_penalties_and_a_grammar(params):
    """Two drafted tokens: each position's p counts the tokens kept before it (frequency penalty) and
    masks by the grammar's state after them; the joint law of three generated tokens is the target's."""
    controls = Controls(frequency_penalty=1.0, min_tokens=2)
    gen = torch.Generator().manual_seed(11)
    prompt = [3, 4]

    def exact(prefix: list[int], c: TokenChooser) -> np.ndarray:
        return probabilities(c.allowed_row(toy(prompt + prefix), CAP), params, None)

    def after(*tokens: int) -> TokenChooser:
        c = chooser(controls, grammar=True)
        for t in tokens:
            c.commit(t)
        return c

    joint = np.zeros((V, V, V))
    p1 = exact([], after())
    for a in np.flatnonzero(p1).tolist():
        p2 = exact([a], after(a))
        for b in np.flatnonzero(p2).tolist():
            joint[a, b] = p1[a] * p2[b] * exact([a, b], after(a, b))
    counts = np.zeros((V, V, V), dtype=np.int64)
    for _ in range(TRIALS):
        c = chooser(controls, grammar=True)
        draft = drafter_draft(c, prompt, 2, params, gen)
        tokens = judge(rows_after(prompt, draft.tokens), draft, c, params, CAP, gen).tokens
        while len(tokens) < 3:  # a rejection came early: plain steps after it
            tokens.append(c.choose(toy(prompt + tokens), params, CAP, gen)[0])
        counts[tuple(tokens[:3])] += 1
    stat, bound = chi_square(counts.ravel(), joint.ravel())
    assert stat < bound, (stat, bound)


def test_a_point_mass_draft_is_checked_by_the_plain_draw_so_seeded_output_is_unchanged():
    """A prompt-lookup draft: the position's token is the one a plain step draws with the same generator;
    the draft is kept when they agree. A seeded generation is the same with and without speculation."""
    for params in SAMPLED:
        prompt = [3, 5, 4, 3]
        want = generate_plain(chooser(), prompt, 30, params, torch.Generator().manual_seed(9))
        got, kept = generate_speculative(chooser(), prompt, 30, 3, params, torch.Generator().manual_seed(9), "lookup")
        assert got[: len(want)] == want and kept > 0


def test_dense_q_rejection_keeps_when_q_equals_p_and_never_draws_what_p_excludes():
    p = np.array([0.0, 0.5, 0.25, 0.25, 0, 0, 0, 0])
    gen = torch.Generator().manual_seed(0)
    assert all(accept_or_resample(p, 3, p.copy(), gen) == 3 for _ in range(50))  # q == p: always kept
    q = np.full(V, 1 / V)
    got = np.bincount([accept_or_resample(p, int(draw(q, gen)), q, gen) for _ in range(2000)], minlength=V)
    assert got[0] == 0 and got[4:].sum() == 0


def generate_plain(c: TokenChooser, prompt: list[int], n: int, params, gen) -> list[int]:
    out: list[int] = []
    while len(out) < n:
        token = c.choose(toy(prompt + out), params, CAP, gen)[0]
        out.append(token)
        if c.ends_generation(token):
            break
    return out


def generate_speculative(c: TokenChooser, prompt: list[int], n: int, k: int, params, gen, drafter: str):
    """The first token from the prompt's logits, then verify steps; (tokens, drafted tokens kept)."""
    out = [c.choose(toy(prompt), params, CAP, gen)[0]]
    context, kept = Context(prompt + out), 0
    while len(out) < n and not c.ends_generation(out[-1]):
        here = prompt + out
        draft = lookup_draft(context, k, 1, 3, c) if drafter == "lookup" else drafter_draft(c, here, k, params, gen)
        verdict = judge(rows_after(here, draft.tokens), draft, c, params, CAP, gen)
        kept += verdict.accepted
        for t in verdict.tokens:
            out.append(t)
            context.append(t)
    return out, kept


@pytest.mark.parametrize("drafter", ["lookup", "drafter"])
@pytest.mark.parametrize(
    "controls,grammar",
    [(Controls(), False), (Controls(repetition_penalty=1.2, logit_bias=((6, 3.0),)), False), (Controls(), True)],
)
def test_greedy_speculation_is_greedy_decoding_token_for_token(drafter, controls, grammar):
    total = 0
    for seed in range(6):
        prompt = [3 + seed % 4, 4, 5, 3 + seed % 4]
        want = generate_plain(chooser(controls, grammar), prompt, 40, GREEDY, torch.Generator())
        got, kept = generate_speculative(chooser(controls, grammar), prompt, 40, 4, GREEDY, torch.Generator(), drafter)
        assert got[: len(want)] == want, seed
        total += kept
    assert total > 10  # drafts were kept: the comparison went through acceptance, not only corrections


def test_greedy_keeps_the_longest_agreeing_prefix_and_the_targets_next_token():
    rows = torch.full((4, V), -5.0)
    for i, t in enumerate((2, 3, 7, 1)):
        rows[i, t] = 5.0  # the target's argmax after each position
    for tokens, want in [((2, 3, 7), [2, 3, 7, 1]), ((2, 3, 6), [2, 3, 7]), ((5, 3, 7), [2]), ((), [2])]:
        verdict = judge(rows[: len(tokens) + 1], Draft(tokens), chooser(), GREEDY, CAP, torch.Generator())
        assert verdict.tokens == want and verdict.accepted == len(want) - 1 and not verdict.dead_end
    rows[1, 0] = 9.0  # the target would end the generation after 2 (0 is EOS)
    verdict = judge(rows, Draft((2, 0, 7)), chooser(), GREEDY, CAP, torch.Generator())
    assert verdict.tokens == [2, 0] and verdict.accepted == 2  # nothing is generated past an end id


def test_a_trial_leaves_the_chooser_as_it_found_it():
    c = chooser(Controls(repetition_penalty=1.5, frequency_penalty=0.5, min_tokens=3), grammar=True)
    c.commit(5)
    before = (c.generated, dict(c.counts), c.seen.tolist(), list(c.matcher.taken))
    row = toy([1, 2])
    allowed = c.allowed_row(row, CAP)
    with c.trial():
        for t in (6, 5, 7, 1):
            c.commit(t)
        assert c.generated == 5 and c.counts[5] == 2
    assert (c.generated, dict(c.counts), c.seen.tolist(), list(c.matcher.taken)) == before
    assert np.array_equal(c.allowed_row(row, CAP), allowed)


def test_a_dead_end_ends_the_verdict():
    class Nothing(NoRepeat):
        def mask(self, x):
            x[:] = -np.inf
            return x

    c = TokenChooser(Controls(), [1], EOS, Nothing())  # type: ignore[arg-type]
    verdict = judge(rows_after([1], (2,)), Draft((2,)), c, GREEDY, CAP, torch.Generator())
    assert verdict.dead_end and verdict.tokens == []


def test_the_residual_draw_excludes_what_q_covers():
    p = np.array([0.1, 0.4, 0.5, 0, 0, 0, 0, 0])
    q = np.array([0.0, 0.8, 0.2, 0, 0, 0, 0, 0])
    gen = torch.Generator().manual_seed(3)
    got = np.bincount([accept_or_resample(p, int(draw(q, gen)), q, gen) for _ in range(TRIALS)], minlength=V)
    stat, bound = chi_square(got, p)
    assert stat < bound
