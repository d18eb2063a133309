"""One generation's host-side choice of its next token: penalties, logit bias, banned end-of-generation
ids (`min_tokens`), the grammar mask, then sampling; and the logprobs a client asked for.

Order, as vLLM's sampler does it: the softcapped logits (the model's output), then the repetition
penalty (prompt and output ids), frequency and presence penalties (output ids), logit bias, the bans
and the grammar mask, then temperature / top-k / top-p. Penalties and bias touch only the ids they
name, so the step costs at most one extra pass over the vocabulary (the softcap, when a penalty or bias
must act on capped values) plus the mask when there is a grammar. A request that asks for none of it
takes `sampling.sample` unchanged.

Logprobs are those of the model's own distribution, `log_softmax(softcap(raw logits))`: before
temperature, penalties, bias and the grammar mask, as vLLM's default (`raw_logprobs`) reports them."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from runtime.generate.grammar import GrammarMatcher
from runtime.generate.sampling import SamplingParams, distribution, draw, row_weights, sample, softcap, top_candidates


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


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float | None  # None: nothing predicts it (a prompt's first token)
    top: tuple[tuple[int, float], ...]  # the most likely ids and their logprobs, best first
    rank: int | None = None  # 1 + how many ids are likelier (asked for a prompt's tokens, as vLLM reports them)


def float_row(logits: torch.Tensor) -> np.ndarray:
    """The raw row as a float32 array of its own (a bf16 row's conversion already is one)."""
    row = logits.float()
    return row.numpy().copy() if row is logits else row.numpy()


def capped_row(logits: torch.Tensor, cap: float | None) -> np.ndarray:
    """softcap(raw row) as a fresh float32 array: cap * tanh(x / cap) = 2 * cap * sigmoid(2x / cap) - cap,
    in torch's vectorised sigmoid (tanh costs ~4x more at 262,144 values)."""
    if not cap:
        return float_row(logits)
    return torch.mul(logits.float(), 2.0 / cap).sigmoid_().mul_(2.0 * cap).sub_(cap).numpy()


def logprobs(logits: torch.Tensor, token: int, k: int, cap: float | None) -> TokenLogprob:
    """The chosen token's logprob and the k best, under log_softmax(softcap(raw)): one transcendental
    pass for the normaliser, then only the named ids."""
    return _logprobs_of_row(logits.float().numpy(), token, k, cap)


def prompt_logprob(logits: torch.Tensor, token: int, k: int, cap: float | None) -> TokenLogprob:
    """`logprobs` of a prompt token under the logits of the positions before it, with its rank (one more
    comparison pass; the softcap is monotonic, so the raw row ranks as the capped one)."""
    x = logits.float().numpy()
    return _logprobs_of_row(x, token, k, cap, rank=1 + int(np.count_nonzero(x > x[token])))


def _logprobs_of_row(x: np.ndarray, token: int, k: int, cap: float | None, rank: int | None = None) -> TokenLogprob:
    """`logprobs` of a raw row already in float32 (converting a 262,144-wide bf16 row costs ~50 us)."""
    top = float(x.max())
    log_total = math.log(float(row_weights(x, cap, 1.0).sum(dtype=np.float64)))
    shift = float(softcap(np.array([top], dtype=np.float32), cap)[0]) + log_total

    def lp(values: np.ndarray) -> np.ndarray:
        return softcap(values.astype(np.float32), cap) - shift

    best = ()
    if k:
        values, ids = top_candidates(x, k)
        best = tuple(zip(ids.tolist(), lp(values).tolist()))
    # A token among the best takes that very number: a harness compares them for equality (is it greedy?)
    own = dict(best).get(token)
    return TokenLogprob(token, float(lp(x[token : token + 1])[0]) if own is None else own, best, rank)


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

    def choose(
        self, logits: torch.Tensor, params: SamplingParams, cap: float | None, generator: torch.Generator
    ) -> tuple[int, TokenLogprob | None]:
        """The next token from a raw logits row (V,), and its logprobs if the request asked for them."""
        c = self.controls
        banned = self.generated < c.min_tokens
        if not (c.penalised or self.bias.size or banned or self.matcher):
            token = sample(logits, params, cap, generator)
        else:
            if c.penalised or self.bias.size:
                x, cap_left = capped_row(logits, cap), None
            else:  # bans and the mask commute with the (monotonic) softcap: sampling still applies it
                x, cap_left = float_row(logits), cap
            self._shape(x, banned)
            if params.greedy:
                token = int(x.argmax())
            else:
                weights, ids = distribution(x, params, cap_left)
                i = draw(weights, generator)
                token = i if ids is None else int(ids[i])
        self.generated += 1
        self.counts[token] = self.counts.get(token, 0) + 1
        if self.seen is not None and not np.isin(token, self.seen):
            self.seen = np.union1d(self.seen, [token])
        if self.matcher is not None and not self.matcher.finished:  # past its end only EOS comes (ignore_eos)
            self.matcher.accept(token)
        lp = None if c.logprobs is None else logprobs(logits, token, c.logprobs, cap)
        return token, lp

    def _shape(self, x: np.ndarray, banned: bool) -> None:
        c = self.controls
        if self.seen is not None:
            v = x[self.seen]
            x[self.seen] = np.where(v > 0, v / c.repetition_penalty, v * c.repetition_penalty)
        if self.counts and (c.frequency_penalty or c.presence_penalty):
            ids = np.fromiter(self.counts, dtype=np.int64, count=len(self.counts))
            n = np.fromiter(self.counts.values(), dtype=np.float32, count=len(self.counts))
            x[ids] -= c.frequency_penalty * n + c.presence_penalty
        if self.bias.size:
            x[self.bias_ids] += self.bias
        if banned and self.ends:
            x[list(self.ends)] = -np.inf
        if self.matcher is not None:
            self.matcher.mask(x)

    def ends_generation(self, token: int) -> bool:
        """An end-of-generation id (unless ignore_eos) or one of the request's stop_token_ids."""
        return token in self.ends
