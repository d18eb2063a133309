"""What a choice drafts at a speculative step: how many tokens it may verify (planning, pure), and the
draft itself, from prompt lookup or from a drafter's logits rows.

A verify step feeds the choice's next token and n drafted ones at positions p .. p + n, and generates
1 to n + 1 tokens, so n is bounded by the step's k, by the room left before kv_max (the last position
written is at most kv_max - 1) and by the tokens the request may still generate (never more than
max_tokens). A drafter's tokens are drawn from the request's own processing of its rows, at each
drafted position as if the tokens before it had been generated (the chooser's trial: penalties,
min_tokens, the grammar mask), so q is what the acceptance rule compares against."""

from __future__ import annotations

import torch

from runtime.generate.acceptance import Draft
from runtime.generate.grammar import GrammarDeadEnd
from runtime.generate.logits import TokenChooser, pick
from runtime.generate.lookup import Context, propose
from runtime.generate.sampling import SamplingParams, draw, probabilities


def room(k: int, generated: int, max_tokens: int, position: int, kv_max: int) -> int:
    """Drafted tokens a choice may verify now: `generated` tokens so far of `max_tokens`, its next
    token to be written at `position`."""
    return max(0, min(k, max_tokens - generated - 1, kv_max - position - 1))


def lookup_draft(context: Context, n: int, min_n: int, max_n: int, chooser: TokenChooser) -> Draft:
    """Prompt lookup's draft of at most n tokens, cut after a token that would end the generation
    (nothing after it could be kept)."""
    tokens = propose(context.tokens, n, min_n, max_n)
    end = next((i + 1 for i, t in enumerate(tokens) if chooser.ends_generation(t)), len(tokens))
    return Draft(tuple(tokens[:end]))


class DrafterDraft:
    """One choice's draft from a drafter, a token per drafter step, inside the chooser's trial."""

    def __init__(self, chooser: TokenChooser, params: SamplingParams, cap: float | None, generator: torch.Generator):
        self.chooser, self.params, self.cap, self.generator = chooser, params, cap, generator
        self.tokens: list[int] = []
        self.q: list = []
        self.done = False  # a token that ends the generation was drafted, or the grammar allows nothing

    def step(self, row: torch.Tensor) -> None:
        """Draft the next token from the drafter's raw row (V,)."""
        c, params = self.chooser, self.params
        try:
            allowed = c.allowed_row(row, self.cap, params.greedy)
        except GrammarDeadEnd:  # the verify step finds it so too, at its own position
            self.done = True
            return
        if params.greedy:
            token = pick(row, allowed, params, self.cap, self.generator)
        else:
            q = probabilities(row, params, self.cap) if allowed is None else probabilities(allowed, params, None)
            token = draw(q, self.generator)
            self.q.append(q)
        self.tokens.append(token)
        c.commit(token)
        self.done = c.ends_generation(token)

    def draft(self) -> Draft:
        return Draft(tuple(self.tokens), None if self.params.greedy else tuple(self.q))
