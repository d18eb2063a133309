"""The engine: one thread that owns the model and the device.

It loads the artifact, proves the output correct (the self-test), then serves: requests wait in
a bounded queue; every free KV slot takes the next request, preferring the slot whose retained KV
shares the longest prefix with its prompt. Each step runs at most `prefill_chunks_per_step` prompt
chunks (0: whole prompts), then one decode step for every decoding slot, so a long prompt delays
the running streams by a chunk at a time. A finished or abandoned request frees its slot at once
and leaves its KV there for a later prompt that shares it. The n choices of a request prefill the
prompt once: the others fork a slot that holds it (a copy of its KV) and draw their first token from
the same first logits. HTTP threads only submit jobs and read their events."""

from __future__ import annotations

import collections
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import torch

from contract.artifact import Geometry, load_meta
from contract.errors import Gemma4Error
from runtime.generate.detok import TextStream
from runtime.generate.grammar import LazyGrammars
from runtime.generate.logits import Controls, TokenChooser, TokenLogprob, prompt_logprob
from runtime.generate.sampling import SamplingParams
from runtime.metrics import Metrics
from runtime.model.loader import LoadedModel, load_artifact
from runtime.model.prefix import choose_slot, forkable, spare_slot
from runtime.model.slots import Slot, SlotState
from runtime.settings import Settings, check_backend

log = logging.getLogger("gemma4.engine")

IDLE_POLL_S = 0.1  # how often an idle engine looks up from the queue to notice a shutdown
ABANDON_POLL_S = 0.05  # how often a waiting request asks whether its client is still there
# A prefill or decode call still running after this long: the device or its runtime hangs, and only a
# restart helps (a step takes milliseconds; a prefill chunk of the largest bucket well under a second).
STUCK_AFTER_S = 60.0
WAIT = -1  # no slot yet for this choice: another choice of its request is prefilling the prompt


class State(str, Enum):
    LOADING = "loading"
    SELF_TEST = "self-test"
    READY = "ready"
    DRAINING = "draining"  # SIGTERM: the requests in flight finish, new ones are refused
    FAILED = "failed"
    STOPPED = "stopped"  # closed on shutdown


class NotReady(Gemma4Error, RuntimeError):
    pass


class QueueFull(Gemma4Error, RuntimeError):
    pass


class DoesNotFit(Gemma4Error, ValueError):
    """A prompt or max_tokens that the artifact's kv_max cannot hold; never truncated."""


def token_budget(geo: Geometry, prompt_len: int, max_tokens: int | None, default: int | None = None) -> int:
    """The number of new tokens a request may generate: `max_tokens` if it fits, else an error
    naming the numbers; without `max_tokens`, `default` capped to the room left (or all of it)."""
    if prompt_len > geo.kv_max - 1:
        raise DoesNotFit(
            f"the prompt has {prompt_len} tokens; the context of this model is {geo.kv_max} tokens, "
            f"so a prompt may have at most {geo.kv_max - 1} (one position for the first new token); "
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


Event = Delta | Finished | Failed


@dataclass
class FirstLogits:
    """What the n choices of one request share while some have no slot yet: the prompt's logits,
    once a choice's prefill gave them (a 262,144-wide row is 0.5 MB in bf16: dropped when the last
    choice has started)."""

    waiting: int  # choices not yet given a slot
    logits: torch.Tensor | None = None  # (V,) raw, after the prompt's last token


@dataclass
class Job:
    """One request as the engine sees it. The HTTP thread iterates `events()`; a client that goes
    away calls `cancel()` and the engine frees the slot at its next step."""

    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...] = ()
    seed: int | None = None
    controls: Controls = Controls()
    grammar: str | None = None  # compiled by Grammars.compile in the HTTP thread (a bad one is a 400 there)
    skip_special_tokens: bool = True
    prompt_logprobs: int | None = None  # alternatives per prompt token when the prompt's logprobs are asked for
    index: int = 0  # the choice this job produces; the n jobs of one request share one event queue
    first: FirstLogits | None = field(default=None, repr=False)  # n > 1: shared by the n jobs
    accepted: float = field(default_factory=time.perf_counter)
    _events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue, repr=False)
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def prefill(self) -> list[int]:
        """What its slot prefills: the prompt, or only its first token when the prompt's logprobs are
        asked for. The prefill graph gives the last position's logits only, so the rest of that prompt is
        fed one decode step per token (teacher forcing, beside the other slots' steps), each step's
        logits scoring the next prompt token; no retained prefix is reused for it."""
        return self.prompt[:1] if self.prompt_logprobs is not None else self.prompt

    def put(self, event: Event) -> None:
        self._events.put(event)

    def events(self, choices: int = 1, abandoned: Callable[[], bool] | None = None):
        """Deltas, then exactly one Finished or Failed per choice (of the `choices` jobs sharing the
        queue). `abandoned` (the client left?) is asked every ABANDON_POLL_S meanwhile; once it says yes
        the job is cancelled and a Finished("cancelled") follows per choice."""
        check = time.monotonic() + ABANDON_POLL_S
        while choices:
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
        first logits."""
        seed = None if self.seed is None else self.seed + index
        return dataclasses.replace(self, index=index, seed=seed, _events=self._events, _cancelled=self._cancelled)


@dataclass
class _Live:
    """A job in a slot (the slot's `request`)."""

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

    def __post_init__(self):
        self.fed = len(self.job.prefill)


class Engine:
    def __init__(self, settings: Settings, metrics: Metrics | None = None):
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.state = State.LOADING
        self.reason = "loading the artifact"
        self.model: LoadedModel | None = None
        self.grammars: LazyGrammars | None = None
        self.model_name = settings.model_name
        # A request's n choices are queued as one item (they count as one waiting request); the
        # engine thread takes them into slots as slots free up, ahead of the next request.
        self._queue: queue.Queue[list[Job]] = queue.Queue(maxsize=settings.queue_max)
        self._choices: collections.deque[Job] = collections.deque()
        self._lock = threading.Lock()  # state changes vs. submissions: no job is queued after the drain
        self._closing = threading.Event()
        self._settled = threading.Event()  # set once ready, failed or stopped
        self._call_started: float | None = None  # when the device call in progress began
        self._thread = threading.Thread(target=self._run, name="gemma4-engine", daemon=True)
        self.metrics.watch(queue_depth=lambda: self.queue_depth, busy_slots=lambda: self.busy_slots)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> Engine:
        log.info("engine state: %s (%s)", self.state.value, self.settings.artifact)
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> State:
        """Block until the engine is ready, failed or stopped (or the timeout passes)."""
        self._settled.wait(timeout)
        return self.state

    def drain(self) -> None:
        """Refuse new requests (503, retry elsewhere) and let the ones in flight finish."""
        if self.state is State.READY:
            self._set(State.DRAINING, "the server is shutting down: finishing the requests in flight")

    @property
    def idle(self) -> bool:
        return not self.busy_slots and self._queue.empty()

    def problem(self) -> str | None:
        """Why this process should be restarted (liveness), or None: the engine thread is gone, or a
        device call it started has not returned within STUCK_AFTER_S."""
        if self.state is State.FAILED or (self.state is not State.STOPPED and not self._thread.is_alive()):
            return f"the engine thread is not running ({self.state.value}: {self.reason})"
        started = self._call_started
        if started is not None and time.monotonic() - started > STUCK_AFTER_S:
            return (
                f"a device call has not returned for {time.monotonic() - started:.0f} s (bound {STUCK_AFTER_S:.0f} s)"
            )
        return None

    def close(self, timeout: float = 30.0) -> None:
        """Stop the engine thread; requests still waiting or running get a Failed event."""
        if self.state is not State.FAILED:
            self._set(State.STOPPED, "the server is shutting down")
        self._closing.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._fail_all("the server is shutting down")
        if self.model is not None:
            self.model.close()
            self.model = None

    def _set(self, state: State, reason: str = "") -> None:
        with self._lock:
            if self.state is State.STOPPED:
                return  # closed while loading: the loading thread must not bring it back
            self.state, self.reason = state, reason
        self.metrics.ready.set(state is State.READY)
        if state is not State.SELF_TEST:
            self._settled.set()
        if state is State.FAILED:
            log.error("engine state: %s: %s", state.value, reason)
        else:
            log.info("engine state: %s%s", state.value, f" ({reason})" if reason else "")

    def _run(self) -> None:
        try:
            check_backend(self.settings, load_meta(self.settings.artifact).backend)
            self.model = load_artifact(self.settings.artifact)
            self.grammars = LazyGrammars(self.model.tokenizer, self.geometry.vocab, self.model.meta.eos_token_ids)
            self.model_name = self.settings.model_name or self.model.meta.name
            self.metrics.slots.set(self.geometry.batch)
            self._set(State.SELF_TEST, f"{len(self.model.meta.golden)} golden prompt(s)")
            self.model.self_test()
        except Exception as exc:  # every failure to come up is reported by /ready, not raised
            log.exception("loading or self-test failed")
            self._set(State.FAILED, f"{type(exc).__name__}: {exc}")
            return
        self._set(State.READY, f"serving {self.model_name} with {self.geometry.batch} slot(s)")
        try:
            while not self._closing.is_set():
                self._admit()
                if self._busy():
                    self._step()
        except Exception as exc:  # the device state is unknown now: stop claiming readiness
            log.exception("engine loop failed")
            self._set(State.FAILED, f"engine error: {type(exc).__name__}: {exc}")
            self._fail_all(f"engine error: {exc}")

    # -- requests --------------------------------------------------------------------------------
    @property
    def geometry(self) -> Geometry:
        return self.model.meta.geometry

    @property
    def tokenizer(self):
        return self.model.tokenizer

    @property
    def busy_slots(self) -> int:
        model = self.model
        return 0 if model is None else sum(not s.free for s in model.runner.slots)

    def _busy(self) -> dict[int, _Live]:
        """Slot index -> the job it serves (engine thread only)."""
        return {s.index: s.request for s in self.model.runner.slots if not s.free} if self.model else {}

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize()

    def submit(self, job: Job, choices: int = 1) -> Job:
        """Queue a job with its other choices (n > 1: seeds seed + i, one event queue, one prefill)."""
        if choices > 1 and job.prompt_logprobs is None:  # a teacher-forced prompt has no prefill to share
            job.first = FirstLogits(waiting=choices)
        with self._lock:
            if self.state is not State.READY:
                raise NotReady(f"the model is not ready ({self.state.value}: {self.reason})")
            try:
                self._queue.put_nowait([job] + [job.choice(i) for i in range(1, choices)])
            except queue.Full:
                raise QueueFull(
                    f"all {self.geometry.batch} slot(s) are busy and {self.settings.queue_max} "
                    "request(s) are already waiting; retry shortly"
                ) from None
        return job

    def _fail_all(self, message: str) -> None:
        """After the state left READY (so nothing new is queued): fail every waiting and running job."""
        while True:
            try:
                self._choices.extend(self._queue.get_nowait())
            except queue.Empty:
                break
        while self._choices:
            job = self._choices.popleft()
            job.put(Failed(message, job.index))
        for slot, live in self._busy().items():
            self.model.runner.free(slot)
            live.job.put(Failed(message, live.job.index))

    # -- scheduling (engine thread only) ---------------------------------------------------------
    def _admit(self) -> None:
        """Give waiting jobs to free slots (their prompts prefill in the steps that follow, or they
        fork another choice's slot and decode at once); block briefly for work only when nothing runs."""
        runner = self.model.runner
        while free := sorted((s for s in runner.slots if s.free), key=lambda s: s.released):
            if (ready := self._next_choice()) is None:
                return
            job, source = ready
            logits = None if job.first is None else job.first.logits
            if job.first is not None:
                job.first.waiting -= 1
                if not job.first.waiting:
                    job.first.logits = None  # 0.5 MB at vocab 262,144 in bf16: not kept past the last choice
            if job.cancelled:
                job.put(Finished("cancelled", len(job.prompt), 0, job.index))
                continue
            live = self._live(job)
            if live is None:
                continue
            if source is not None:
                self._fork(source, free, live, logits)
                continue
            reuse = self.settings.prefix_reuse
            slot, reused = choose_slot(
                self.geometry,
                {s.index: s.tokens if reuse else None for s in free},
                job.prefill,
                {s.index: s.reach for s in free},
            )
            self.metrics.prefix_admitted(reused)
            runner.slots[slot].request = live
            runner.start(slot, job.prefill, reused)

    def _next_choice(self) -> tuple[Job, int | None] | None:
        """The first waiting choice that can start now, taken out of the line, and the slot it forks
        (None: it prefills). A choice whose prompt another choice is prefilling stays in line, and the
        requests behind it go first: it forks later from any slot that holds the prompt."""
        i = 0
        while True:
            if i == len(self._choices):
                try:
                    self._choices.extend(
                        self._queue.get_nowait() if self._busy() else self._queue.get(timeout=IDLE_POLL_S)
                    )
                except queue.Empty:
                    return None
            job = self._choices[i]
            source = None if job.cancelled else self._fork_source(job)
            if source != WAIT:
                del self._choices[i]
                return job, source
            i += 1

    def _fork_source(self, job: Job) -> int | None:
        """For another choice of a request whose prompt's logits are kept: the slot to copy, the one
        holding the prompt with the fewest positions past it, a free one first (used where it is, no
        copy); None to prefill (none holds it, or n = 1); WAIT while a choice prefills it.
        Without prefix reuse only the slots serving the request's choices count."""
        first, slots = job.first, self.model.runner.slots
        if first is None:
            return None
        if first.logits is None:
            mine = any(s.state is SlotState.PREFILLING and s.request.job.first is first for s in slots)
            return WAIT if mine else None
        held = [
            s
            for s in slots
            if s.state is not SlotState.PREFILLING
            and forkable(self.geometry, s.tokens, job.prompt, s.reach)
            and (self.settings.prefix_reuse or (not s.free and s.request.job.first is first))
        ]
        best = min(held, key=lambda s: (not s.free, len(s.tokens)), default=None)
        return None if best is None else best.index

    def _fork(self, source: int, free: list[Slot], live: _Live, logits: torch.Tensor) -> None:
        """Start a choice in a copy of slot `source`'s KV (in that slot itself if it is free) and draw
        its first token from the request's first logits, with its own generator."""
        runner, prompt = self.model.runner, live.job.prompt
        slot = source if runner.slots[source].free else spare_slot({s.index: s.tokens for s in free})
        self._device(runner.fork, source, slot, len(prompt))
        self.metrics.forked(len(prompt))
        runner.slots[slot].request = live
        self._accept(slot, logits)

    def _live(self, job: Job) -> _Live | None:
        """A job's sampling state for its slot, or None after a Failed event (a grammar that cannot start)."""
        generator = torch.Generator()
        if job.seed is None:
            generator.seed()
        else:
            generator.manual_seed(job.seed % 2**64)
        try:
            matcher = None if job.grammar is None else self.grammars.get().matcher(job.grammar)
        except ValueError as exc:  # checked at submission: only a matcher that cannot start gets here
            job.put(Failed(f"the grammar cannot start: {exc}", job.index))
            return None
        chooser = TokenChooser(job.controls, job.prompt, self.model.meta.eos_token_ids, matcher)
        text = TextStream(self.tokenizer, job.stop, job.skip_special_tokens, job.controls.min_tokens)
        return _Live(job, text, generator, chooser, job.accepted)

    def _step(self) -> None:
        for slot in [s for s, live in self._busy().items() if live.job.cancelled]:
            self._finish(slot, "cancelled")
        runner = self.model.runner
        # Oldest request first: it has waited longest for its first token.
        waiting = sorted(
            (s for s in runner.slots if s.state is SlotState.PREFILLING), key=lambda s: s.request.job.accepted
        )
        budget, shared = self.settings.prefill_chunks_per_step or float("inf"), False
        for s in waiting:
            while budget and s.state is SlotState.PREFILLING:
                budget -= 1
                logits = self._device(runner.prefill_step, s.index)
                if logits is not None:
                    shared = self._share(s.request.job, logits) or shared
                    self._accept(s.index, logits)
        if shared:  # the request's other choices fork now and decode in this step
            self._admit()
        decoding = {s.index: s.request.last for s in runner.slots if s.state is SlotState.DECODING}
        if decoding:
            for slot, row in self._device(runner.decode, decoding).items():
                self._accept(slot, row)

    @staticmethod
    def _share(job: Job, logits: torch.Tensor) -> bool:
        """Keep the prompt's logits for the request's choices still without a slot: a copy, so that
        neither a backend reusing its output buffer nor a view of the whole batch keeps more alive."""
        first = job.first
        if first is None or not first.waiting or first.logits is not None:
            return False
        first.logits = logits.clone()
        return True

    def _device(self, call, *args):
        """A runner call, timed for the liveness check."""
        self._call_started = time.monotonic()
        try:
            return call(*args)
        finally:
            self._call_started = None

    def _accept(self, slot: int, logits: torch.Tensor) -> None:
        """Choose the next token of a slot from its logits and pass on the text it completes."""
        live = self.model.runner.slots[slot].request
        job = live.job
        if live.fed < len(job.prompt):
            return self._force(live, logits)
        if not job.max_tokens:  # max_tokens 0 (echo): the prompt is scored, nothing is generated
            return self._finish(slot, "length")
        try:
            token, logprob = live.chooser.choose(logits, job.sampling, self.geometry.softcap, live.generator)
        except ValueError as exc:  # a grammar that cannot go on: this request fails, the others go on
            self.model.runner.free(slot)
            return job.put(Failed(f"constrained decoding failed: {exc}", job.index))
        now = time.perf_counter()
        (self.metrics.token_latency if live.generated else self.metrics.ttft).observe(now - live.last_time)
        self.metrics.tokens.inc()
        live.last_time, live.last = now, token
        live.generated += 1
        if logprob is not None:  # an end id's too, as vLLM gives it: one logprob per generated token
            live.logprobs.append(logprob)
        if live.chooser.ends_generation(token):  # an end id is not part of the reply's text
            return self._finish(slot, "stop")
        text = live.text.push(token)
        if text:
            job.put(Delta(text, job.index, live.generated, tuple(live.logprobs)))
            live.logprobs.clear()
        if live.text.stopped:
            self._finish(slot, "stop")
        elif live.generated >= job.max_tokens:
            self._finish(slot, "length")

    def _force(self, live: _Live, logits: torch.Tensor) -> None:
        """Teacher forcing: the logits score the prompt's next token, which is fed instead of a sampled
        one; once the prompt is in, its logprobs go out in one Delta and sampling starts."""
        job = live.job
        token = job.prompt[live.fed]
        live.prompt_logprobs.append(prompt_logprob(logits, token, job.prompt_logprobs, self.geometry.softcap))
        live.fed += 1
        live.last = token
        if live.fed == len(job.prompt):
            job.put(Delta("", job.index, prompt_logprobs=tuple(live.prompt_logprobs)))
            live.prompt_logprobs.clear()

    def _finish(self, slot: int, reason: str) -> None:
        live = self.model.runner.slots[slot].request
        job = live.job
        self.model.runner.free(slot)
        if reason != "cancelled" and not live.text.stopped:
            rest = live.text.flush()
            if rest:
                job.put(Delta(rest, job.index, live.generated, tuple(live.logprobs)))
                live.logprobs.clear()
            if live.text.stopped:  # a stop string completed by the flush (one holding U+FFFD)
                reason = "stop"
        job.put(Finished(reason, len(job.prompt), live.generated, job.index, tuple(live.logprobs)))
