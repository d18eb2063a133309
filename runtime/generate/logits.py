"""One generation's choice of its next token, as one pipeline over the raw row (V,) the device returns:

    raw --softcap--> capped --penalties, logit bias--> edited --bans, grammar mask (-inf)--> allowed
        --temperature, min-p, top-k, top-p, draw (runtime.generate.sampling)--> token

The order is vLLM's sampler's: the softcapped logits (the model's output), the repetition penalty
(prompt and output ids), frequency and presence penalties (output ids), logit bias, then the bans
(`min_tokens`) and the grammar mask, then temperature / top-k / top-p. The forbidden ids are set to
-inf last and on capped values, where nothing after them can lift them (-inf / T is -inf, its weight
exp(-inf) exactly 0, at every temperature, top-k, top-p and min-p). Penalties and bias touch only the
ids they name, so an edited step costs one extra pass over the vocabulary (the softcap) plus the mask
when there is a grammar; a request that asks for none of it samples the raw row directly (the softcap
folded into the weights).

The logprobs a client asks for are the model's own (runtime.generate.logprobs), before all of this."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from contract.greedy import softcap
from runtime.generate.grammar import GrammarDeadEnd, GrammarMatcher
from runtime.generate.logprobs import TokenLogprob, logprobs
from runtime.generate.sampling import SamplingParams, sample


@dataclass(frozen=True)
class Controls:
    """What a request asks of the host beyond SamplingParams (each default changes nothing)."""

    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None  # alternatives per token (0: the chosen token's only); None: no logprobs

    @property
    def penalised(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)


def capped_row(logits: torch.Tensor, cap: float | None) -> np.ndarray:
    """softcap(raw row) as a float32 array of its own, to edit in place (the input is left alone)."""
    row = logits.float()
    if cap:
        return softcap(row, cap).numpy()
    return row.numpy().copy() if row is logits else row.numpy()  # a bf16 row's conversion already is a copy


class TokenChooser:
    """One generation's state for choosing tokens: the ids it generated and how often (penalties), its
    prompt (repetition penalty), and its grammar matcher."""

    def __init__(
        self, controls: Controls, prompt: list[int], eos_ids: tuple[int, ...], matcher: GrammarMatcher | None = None
    ):
        self.controls = controls
        self.matcher = matcher
        # What min_tokens holds back: every id that would end the generation.
        self.ends = tuple(dict.fromkeys((*(() if controls.ignore_eos else eos_ids), *controls.stop_token_ids)))
        self.generated = 0
        self.counts: dict[int, int] = {}
        self.seen = np.unique(np.asarray(prompt, dtype=np.int64)) if controls.repetition_penalty != 1.0 else None
        bias = dict(controls.logit_bias)
        self.bias_ids = np.fromiter(bias, dtype=np.int64, count=len(bias))
        self.bias = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
        self._trial: list[tuple[int, bool, bool]] | None = None  # (token, new to `seen`, the matcher took it)

    def choose(
        self, logits: torch.Tensor, params: SamplingParams, cap: float | None, generator: torch.Generator
    ) -> tuple[int, TokenLogprob | None]:
        """The next token from a raw logits row (V,), and its logprobs if the request asked for them.
        A GrammarDeadEnd when the grammar allows no token here; a GrammarError when its matcher fails."""
        token = pick(logits, self.allowed_row(logits, cap, params.greedy), params, cap, generator)
        lp = self.logprob(logits, token, cap)
        self.commit(token)
        return token, lp

    def logprob(self, logits: torch.Tensor, token: int, cap: float | None) -> TokenLogprob | None:
        """The token's logprobs under the model's own row, if the request asked for them."""
        c = self.controls
        return None if c.logprobs is None else logprobs(logits, token, c.logprobs, cap)

    def commit(self, token: int) -> None:
        """`token` is the generation's next: the penalties count it, the grammar takes it."""
        self.generated += 1
        self.counts[token] = self.counts.get(token, 0) + 1
        added = False
        if self.seen is not None and not np.isin(token, self.seen):
            self.seen, added = np.union1d(self.seen, [token]), True
        matcher = self.matcher if self.matcher is not None and not self.matcher.finished else None
        if self._trial is not None:  # past its end the matcher takes nothing more (only EOS comes)
            self._trial.append((token, added, matcher is not None))
        if matcher is not None:
            matcher.accept(token)

    @contextlib.contextmanager
    def trial(self) -> Iterator[None]:
        """Tokens committed inside are taken back on the way out (a draft: the penalties, min_tokens and
        the grammar at each drafted position as if the tokens before it had been generated)."""
        self.begin_trial()
        try:
            yield
        finally:
            self.end_trial()

    def begin_trial(self) -> None:
        assert self._trial is None, "trials do not nest"
        self._trial = []

    def end_trial(self) -> None:
        """Take back what was committed since begin_trial (a GrammarError if the matcher cannot)."""
        undo, self._trial = self._trial or [], None
        for token, added, _ in reversed(undo):
            self.generated -= 1
            self.counts[token] -= 1
            if not self.counts[token]:
                del self.counts[token]
            if added and self.seen is not None:
                self.seen = self.seen[self.seen != token]
        if self.matcher is not None:
            self.matcher.rollback(sum(consumed for *_, consumed in undo))

    def allowed_row(self, logits: torch.Tensor, cap: float | None, greedy: bool = False) -> np.ndarray | None:
        """The capped row after penalties, bias, bans and the grammar mask (forbidden ids -inf), or None
        when the request edits nothing (the raw row is sampled as it is). Greedy needs no softcap unless
        a penalty or bias must act on capped values: the mask and bans commute with it."""
        c = self.controls
        banned = self.generated < c.min_tokens and bool(self.ends)
        edits = c.penalised or bool(self.bias.size)
        if not (edits or banned or self.matcher):
            return None
        x = capped_row(logits, cap if edits or not greedy else None)
        if self.seen is not None:
            v = x[self.seen]
            x[self.seen] = np.where(v > 0, v / c.repetition_penalty, v * c.repetition_penalty)
        if self.counts and (c.frequency_penalty or c.presence_penalty):
            ids = np.fromiter(self.counts, dtype=np.int64, count=len(self.counts))
            n = np.fromiter(self.counts.values(), dtype=np.float32, count=len(self.counts))
            x[ids] -= c.frequency_penalty * n + c.presence_penalty
        if self.bias.size:
            x[self.bias_ids] += self.bias
        # Last, and on capped values: nothing after this can give a forbidden id any weight.
        if banned:
            x[list(self.ends)] = -np.inf
        if self.matcher is not None:
            self.matcher.mask(x)
            if x.max() == -np.inf:
                raise GrammarDeadEnd("the grammar allows no token here")
        return x

    def ends_generation(self, token: int) -> bool:
        """An end-of-generation id (unless ignore_eos) or one of the request's stop_token_ids."""
        return token in self.ends


def pick(logits: torch.Tensor, allowed: np.ndarray | None, params: SamplingParams, cap: float | None, generator) -> int:
    """The token one step draws: from the raw row when the request edits nothing (`allowed` None), else
    from TokenChooser.allowed_row's row, already capped."""
    return sample(logits, params, cap, generator) if allowed is None else sample(allowed, params, None, generator)
