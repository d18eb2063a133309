"""Which slot does what at each step (engine thread only).

Requests wait in a bounded queue; every free KV slot takes the next request, preferring the slot
whose retained KV shares the longest prefix with its prompt. Each step runs at most
`prefill_chunks_per_step` prompt chunks (0: whole prompts), then one decode step for every decoding
slot, so a long prompt delays the running streams by a chunk at a time. With speculative decoding that
step is a verify pass when a slot has a draft (runtime.generate.speculation). A finished or abandoned
request frees its slot at once and leaves its KV there for a later prompt that shares it. The n
choices of a request prefill the prompt once: the others fork a slot that holds it (a copy of its
KV) and draw their first token from the same first logits.

A request's own work that fails (its sampling state, a prompt chunk, choosing its token) fails that
request alone: its slot is freed and the engine goes on. A failure of a batched decode step leaves the
state of every slot unknown, so it is the engine's (runtime.generate.engine)."""

from __future__ import annotations

import collections
import contextlib
import logging
import queue
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from runtime.generate.grammar import GrammarError
from runtime.generate.output import OutputProcessor
from runtime.generate.sequence import Failed, Finished, Job, Running
from runtime.generate.speculation import Speculator
from runtime.metrics import Metrics
from runtime.model.media import keyed
from runtime.model.prefix import choose_slot, forkable, spare_slot
from runtime.model.runner import ModelRunner
from runtime.model.slots import Slot, SlotState
from runtime.settings import ServerSettings

log = logging.getLogger("gemma4.engine")

IDLE_POLL_S = 0.1  # how often an idle engine looks up from the queue to notice a shutdown

T = TypeVar("T")


@dataclass(frozen=True)
class Prefill:
    """The choice prefills its prompt in a slot of its own."""


@dataclass(frozen=True)
class Fork:
    """The choice starts in a copy of `source`'s KV, which holds its prompt."""

    source: int


@dataclass(frozen=True)
class Wait:
    """No slot yet: another choice of its request is prefilling the prompt."""


Start = Prefill | Fork | Wait


class Scheduler:
    def __init__(
        self,
        settings: ServerSettings,
        metrics: Metrics,
        waiting: queue.Queue[list[Job]],
        runner: ModelRunner,
        output: OutputProcessor,
        speculator: Speculator,
    ):
        self.settings = settings
        self.metrics = metrics
        self.geometry = runner.geo
        self.runner = runner
        self.output = output
        self.speculator = speculator
        # A request's n choices are queued as one item (they count as one waiting request); they are
        # taken into slots as slots free up, ahead of the next request.
        self.waiting = waiting
        self._choices: collections.deque[Job] = collections.deque()
        self.call_started: float | None = None  # when the device call in progress began

    def running(self) -> dict[int, Running]:
        """Slot index -> the choice it serves."""
        return {s.index: s.request for s in self.runner.slots if not s.free}

    def fail_all(self, message: str) -> None:
        """After the engine left READY (so nothing new is queued): fail every waiting and running job."""
        while True:
            try:
                self._choices.extend(self.waiting.get_nowait())
            except queue.Empty:
                break
        while self._choices:
            job = self._choices.popleft()
            job.put(Failed(message, job.index))
        for slot, live in self.running().items():
            self.runner.free(slot)
            live.job.put(Failed(message, live.job.index))

    def admit(self) -> None:
        """Give waiting jobs to free slots (their prompts prefill in the steps that follow, or they
        fork another choice's slot and decode at once); block briefly for work only when nothing runs."""
        runner = self.runner
        while free := sorted((s for s in runner.slots if s.free), key=lambda s: s.released):
            if (ready := self._next_choice()) is None:
                return
            job, start = ready
            logits = None if job.shared is None else job.shared.logits
            hidden = None if job.shared is None else job.shared.hidden
            if job.shared is not None:
                job.shared.waiting -= 1
                if not job.shared.waiting:
                    job.shared.logits = job.shared.hidden = None  # 0.5 MB at vocab 262,144 in bf16: not kept on
            if job.cancelled:
                job.put(Finished("cancelled", len(job.prompt), 0, job.index))
                continue
            with self._alone(job):
                self._place(job, start, free, logits, hidden)

    def _place(
        self,
        job: Job,
        start: Prefill | Fork,
        free: list[Slot],
        logits: torch.Tensor | None,
        hidden: torch.Tensor | None = None,
    ) -> None:
        live = self.output.running(job)
        if isinstance(start, Fork):
            assert logits is not None  # a fork source exists only once the prompt's logits are kept
            self._fork(start.source, free, live, logits, hidden)
            return
        reuse = self.settings.prefix_reuse
        slot, reused = choose_slot(
            self.geometry,
            {s.index: s.tokens if reuse else None for s in free},
            keyed(job.prefill_tokens, job.media),  # an image matches only an image of the same bytes
            {s.index: s.reach for s in free},
        )
        self.metrics.prefix_admitted(reused)
        self.runner.slots[slot].request = live
        self.runner.start(slot, job.prefill_tokens, reused, job.media)

    @contextlib.contextmanager
    def _alone(self, job: Job) -> Iterator[None]:
        """Run one request's own work: if it fails, that request fails (its slot freed), not the engine."""
        try:
            yield
        except GrammarError as exc:  # its grammar met a limit at this step: the client's input, a 400
            log.warning("a request's grammar failed while generating (%s); it alone ends", exc)
            self._free_slots_of(job)
            job.put(Failed(f"the request's grammar failed while generating: {exc}", job.index, 400))
        except Exception:
            log.exception("a request failed in the engine; it alone ends, the engine goes on")
            self._free_slots_of(job)
            job.put(Failed("internal error while generating (the server log has the details)", job.index, 500))

    def _free_slots_of(self, job: Job) -> None:
        for slot in self.runner.slots:
            if not slot.free and slot.request.job is job:
                self.runner.free(slot.index)

    def _next_choice(self) -> tuple[Job, Prefill | Fork] | None:
        """The first waiting choice that can start now, taken out of the line, and how it starts. A
        choice whose prompt another choice is prefilling stays in line, and the requests behind it go
        first: it forks later from any slot that holds the prompt."""
        i = 0
        while True:
            if i == len(self._choices):
                try:
                    self._choices.extend(
                        self.waiting.get_nowait() if self.running() else self.waiting.get(timeout=IDLE_POLL_S)
                    )
                except queue.Empty:
                    return None
            job = self._choices[i]
            start = Prefill() if job.cancelled else self._start_of(job)
            if not isinstance(start, Wait):
                del self._choices[i]
                return job, start
            i += 1

    def _start_of(self, job: Job) -> Start:
        """For another choice of a request whose prompt's logits are kept: fork the slot holding the
        prompt with the fewest positions past it, a free one first (used where it is, no copy); prefill
        when none holds it (or n = 1); wait while a choice prefills it. Without prefix reuse only the
        slots serving the request's choices count."""
        shared, slots = job.shared, self.runner.slots
        if shared is None:
            return Prefill()
        if shared.logits is None:
            mine = any(s.state is SlotState.PREFILLING and s.request.job.shared is shared for s in slots)
            return Wait() if mine else Prefill()
        held = [
            s
            for s in slots
            if s.state is not SlotState.PREFILLING
            and forkable(self.geometry, s.tokens, keyed(job.prompt, job.media), s.reach)
            and (self.settings.prefix_reuse or (not s.free and s.request.job.shared is shared))
        ]
        best = min(held, key=lambda s: (not s.free, len(s.tokens)), default=None)
        return Prefill() if best is None else Fork(best.index)

    def _fork(
        self, source: int, free: list[Slot], live: Running, logits: torch.Tensor, hidden: torch.Tensor | None
    ) -> None:
        """Start a choice in a copy of slot `source`'s KV (in that slot itself if it is free) and draw
        its first token from the request's first logits, with its own generator; its first drafter
        step starts from the prompt's last hidden state (the source may have gone on past the prompt)."""
        runner, prompt = self.runner, live.job.prompt
        slot = source if runner.slots[source].free else spare_slot({s.index: s.tokens for s in free})
        self._device(runner.fork, source, slot, len(prompt), hidden)
        self.metrics.forked(len(prompt))
        runner.slots[slot].request = live
        self.output.accept(slot, logits)

    def step(self) -> None:
        """Cancelled choices leave; prompt chunks (oldest request first) within the step's budget; then
        one decode step for every decoding slot."""
        for slot in [s for s, live in self.running().items() if live.job.cancelled]:
            self.output.finish(slot, "cancelled")
        runner = self.runner
        # Oldest request first: it has waited longest for its first token.
        prefilling = sorted(
            (s for s in runner.slots if s.state is SlotState.PREFILLING), key=lambda s: s.request.job.accepted
        )
        budget, shared = self.settings.prefill_chunks_per_step or float("inf"), False
        for s in prefilling:
            while budget and s.state is SlotState.PREFILLING:
                budget -= 1
                with self._alone(s.request.job):
                    logits = self._device(runner.prefill_step, s.index)
                    if logits is not None:
                        shared = self._share(s.request.job, logits, s.hidden) or shared
                        self.output.accept(s.index, logits)
        if shared:  # the request's other choices fork now and decode in this step
            self.admit()
        decoding = [s for s in runner.slots if s.state is SlotState.DECODING]
        if decoding:
            self._decode(decoding)

    def _decode(self, decoding: list[Slot]) -> None:
        """One step of every decoding slot: a decode step, or a verify step when a slot has a draft (the
        others feed their one next token in it)."""
        runner = self.runner
        drafts = self.speculator.drafts(decoding, lambda live: self._alone(live.job), self._device)
        feed = {s.index: s.request.last for s in decoding if s.state is SlotState.DECODING}  # failed ones left
        if not feed:
            return
        if not drafts:
            for slot, row in self._device(runner.decode, feed).items():
                with self._alone(runner.slots[slot].request.job):
                    self.output.accept(slot, row)
            return
        runs = {slot: [last, *drafts[slot].tokens] if slot in drafts else [last] for slot, last in feed.items()}
        for slot, rows in self._device(runner.verify, runs).items():
            with self._alone(runner.slots[slot].request.job):
                if slot in drafts:
                    self.output.accept_verified(slot, rows, drafts[slot], self.speculator.method or "")
                else:
                    self.output.accept(slot, rows[0])

    @staticmethod
    def _share(job: Job, logits: torch.Tensor, hidden: torch.Tensor | None) -> bool:
        """Keep the prompt's logits and last hidden state for the request's choices still without a
        slot: copies, so that neither a backend reusing its output buffer nor a view of the whole batch
        keeps more alive."""
        shared = job.shared
        if shared is None or not shared.waiting or shared.logits is not None:
            return False
        shared.logits, shared.hidden = logits.clone(), None if hidden is None else hidden.clone()
        return True

    def _device(self, call: Callable[..., T], *args: Any) -> T:
        """A runner call, timed for the liveness check."""
        self.call_started = time.monotonic()
        try:
            return call(*args)
        finally:
            self.call_started = None
