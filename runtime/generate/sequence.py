"""One request as the engine sees it (a `Job` per choice), the events it produces, and the state of a
choice while it runs in a slot (`Running`).

The n choices of a request share one event queue and one cancellation; while some of them have no
slot yet they share the prompt's first logits (`SharedPrompt`), so that the prompt is prefilled once."""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from contract.artifact import Geometry
from contract.errors import Gemma4Error
from runtime.generate.detok import TextStream
from runtime.generate.grammar import GrammarMatcher
from runtime.generate.logits import Controls, TokenChooser
from runtime.generate.logprobs import TokenLogprob
from runtime.generate.lookup import Context
from runtime.generate.sampling import SamplingParams
from runtime.model.media import MediaInput

ABANDON_POLL_S = 0.05  # how often a waiting request asks whether its client is still there


class DoesNotFit(Gemma4Error, ValueError):
    """A prompt or max_tokens that the artifact's kv_max cannot hold; never truncated."""


def token_budget(geo: Geometry, prompt_len: int, max_tokens: int | None, default: int | None = None) -> int:
    """The number of new tokens a request may generate: `max_tokens` if it fits, else an error
    naming the numbers; without `max_tokens`, `default` capped to the room left (or all of it)."""
    if prompt_len > geo.max_prompt:
        raise DoesNotFit(
            f"the prompt has {prompt_len} tokens; the context of this model is {geo.kv_max} tokens, "
            f"so a prompt may have at most {geo.max_prompt} (one position for the first new token); "
            "prompts are never truncated"
        )
    room = geo.kv_max - prompt_len
    if max_tokens is None:
        if room < 1:
            raise DoesNotFit(f"the prompt has {prompt_len} tokens and fills the context of {geo.kv_max} tokens")
        return min(default or room, room)
    if max_tokens > room:
        raise DoesNotFit(
            f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) = {prompt_len + max_tokens} "
            f"exceeds the context of {geo.kv_max} tokens; at most {room} new tokens fit"
        )
    return max_tokens


@dataclass(frozen=True)
class Delta:
    text: str
    index: int = 0  # the choice (n > 1)
    completion_tokens: int = 0  # generated so far
    logprobs: tuple[TokenLogprob, ...] = ()  # of the tokens generated since the last Delta (if asked for)
    prompt_logprobs: tuple[TokenLogprob, ...] = ()  # of the prompt's tokens after the first, once it is in


@dataclass(frozen=True)
class Finished:
    reason: str  # stop | length | cancelled
    prompt_tokens: int
    completion_tokens: int
    index: int = 0
    logprobs: tuple[TokenLogprob, ...] = ()  # of the tokens no Delta carried


@dataclass(frozen=True)
class Failed:
    message: str
    index: int = 0
    status: int = 503  # as the request is answered: 400 when its own input (a grammar) is at fault


Event = Delta | Finished | Failed


@dataclass
class SharedPrompt:
    """What the n choices of one request share while some have no slot yet: the prompt's logits and
    last hidden state, once a choice's prefill gave them (a 262,144-wide row is 0.5 MB in bf16:
    dropped when the last choice has started)."""

    waiting: int  # choices not yet given a slot
    logits: torch.Tensor | None = None  # (V,) raw, after the prompt's last token
    hidden: torch.Tensor | None = None  # (H,) the target's last hidden state there: a fork's first draft starts from it


@dataclass
class Job:
    """One choice of a request. The HTTP thread iterates `events()`; a client that goes away calls
    `cancel()` and the engine frees the slot at its next step."""

    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...] = ()
    seed: int | None = None
    controls: Controls = Controls()
    # Compiled by GrammarCompiler.compile in the HTTP thread (a bad one is a 400 there); each choice forks it.
    grammar: GrammarMatcher | None = field(default=None, repr=False)
    skip_special_tokens: bool = True
    prompt_logprobs: int | None = None  # alternatives per prompt token when the prompt's logprobs are asked for
    media: tuple[MediaInput, ...] = ()  # the prompt's images and clips, in order (never with prompt_logprobs)
    speculate: bool = True  # may draft and verify several tokens per step (the server's method, if any)
    index: int = 0  # the choice this job produces; the n jobs of one request share one event queue
    shared: SharedPrompt | None = field(default=None, repr=False)  # n > 1: shared by the n jobs
    accepted: float = field(default_factory=time.perf_counter)
    _events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue, repr=False)
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def prefill_tokens(self) -> list[int]:
        """What its slot prefills: the prompt, or only its first token when the prompt's logprobs are
        asked for. The prefill graph gives the last position's logits only, so the rest of that prompt is
        fed one decode step per token (teacher forcing, beside the other slots' steps), each step's
        logits scoring the next prompt token; no retained prefix is reused for it."""
        return self.prompt[:1] if self.prompt_logprobs is not None else self.prompt

    def __post_init__(self):
        if self.media and self.prompt_logprobs is not None:  # the API refuses it (a 400)
            raise ValueError("a prompt with media prefills whole: its logprobs cannot be fed a token at a time")

    def put(self, event: Event) -> None:
        self._events.put(event)

    def events(self, choices: int = 1, abandoned: Callable[[], bool] | None = None) -> Iterator[Event]:
        """Deltas, then exactly one Finished or Failed per choice (of the `choices` jobs sharing the
        queue). `abandoned` (the client left?) is asked every ABANDON_POLL_S meanwhile; once it says yes
        the job is cancelled and a Finished("cancelled") follows per choice."""
        check = time.monotonic() + ABANDON_POLL_S
        while choices:
            event: Event | None
            try:
                event = self._events.get(timeout=None if abandoned is None else max(0.0, check - time.monotonic()))
            except queue.Empty:
                event = None
            if abandoned is not None and time.monotonic() >= check:
                check = time.monotonic() + ABANDON_POLL_S
                if not self.cancelled and abandoned():
                    self.cancel()
            if event is None:
                continue
            yield event
            if not isinstance(event, Delta):
                choices -= 1

    def choice(self, index: int) -> Job:
        """Another choice of the same request: its own seed (seed + index), the same event queue and
        shared prompt."""
        seed = None if self.seed is None else self.seed + index
        return dataclasses.replace(self, index=index, seed=seed, _events=self._events, _cancelled=self._cancelled)

    def choices(self, n: int) -> list[Job]:
        """This job and its n - 1 other choices; they share the prompt's prefill unless it is teacher-forced."""
        if n > 1 and self.prompt_logprobs is None:
            self.shared = SharedPrompt(waiting=n)
        return [self] + [self.choice(i) for i in range(1, n)]


@dataclass
class Running:
    """A job in a slot (the slot's `request`): its sampling state and what it has not sent yet."""

    job: Job
    text: TextStream
    generator: torch.Generator
    chooser: TokenChooser
    last_time: float
    last: int = -1  # the token to feed at the next decode step
    generated: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)  # not yet sent
    fed: int = 0  # prompt tokens in the KV (set from the job): below len(prompt) the prompt is teacher-forced
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    context: Context | None = None  # prompt and output so far, when prompt lookup drafts for it

    def __post_init__(self):
        self.fed = len(self.job.prefill_tokens)
