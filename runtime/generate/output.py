"""What a model step means for the choice in a slot: the next token chosen from the slot's logits, the
text it completes (stop strings, detokenisation), its logprobs, teacher forcing of a prompt whose
logprobs are asked for, and the events that carry all of it to the request (engine thread only)."""

from __future__ import annotations

import logging
import time

import torch

from runtime.generate.acceptance import Draft, judge
from runtime.generate.detok import TextStream
from runtime.generate.grammar import GrammarDeadEnd
from runtime.generate.logits import TokenChooser
from runtime.generate.logprobs import TokenLogprob, prompt_logprob
from runtime.generate.lookup import Context
from runtime.generate.sequence import Delta, Finished, Job, Running
from runtime.metrics import Metrics
from runtime.model.loader import LoadedModel

log = logging.getLogger("gemma4.engine")

# How a choice ends when its grammar can go no further: as vLLM reports a structured output that has
# ended, "stop" (the text so far is what the grammar allowed); the server log says why.
DEAD_END_REASON = "stop"


class OutputProcessor:
    def __init__(self, model: LoadedModel, metrics: Metrics, lookup: bool = False):
        self.model = model
        self.runner = model.runner
        self.metrics = metrics
        self.softcap = model.meta.geometry.softcap
        self.lookup = lookup  # prompt lookup drafts: each choice that may speculate keeps its tokens

    def running(self, job: Job) -> Running:
        """A job's sampling state for its slot; its matcher a copy of the one compiled for the request,
        which has started already (a grammar that cannot start was a 400), so nothing slow happens here."""
        generator = torch.Generator()
        if job.seed is None:
            generator.seed()
        else:
            generator.manual_seed(job.seed % 2**64)
        matcher = None if job.grammar is None else job.grammar.fork()
        chooser = TokenChooser(job.controls, job.prompt, self.model.meta.eos_token_ids, matcher)
        text = TextStream(self.model.tokenizer, job.stop, job.skip_special_tokens, job.controls.min_tokens)
        context = Context(job.prompt) if self.lookup and job.speculate else None
        return Running(job, text, generator, chooser, job.accepted, context=context)

    def accept(self, slot: int, logits: torch.Tensor) -> None:
        """Choose the next token of a slot from its logits and pass on the text it completes."""
        live: Running = self.runner.slots[slot].request
        job = live.job
        if live.fed < len(job.prompt):
            return self._force(live, logits)
        if not job.max_tokens:  # max_tokens 0 (echo): the prompt is scored, nothing is generated
            return self.finish(slot, "length")
        try:
            token, logprob = live.chooser.choose(logits, job.sampling, self.softcap, live.generator)
        except GrammarDeadEnd as exc:  # the choice ends here, cleanly; the others go on
            return self._dead_end(slot, live, exc)
        self._emit(slot, live, token, logprob)
        return None

    def accept_verified(self, slot: int, rows: torch.Tensor, draft: Draft, method: str) -> None:
        """A speculative step's tokens for a slot: the target's logits `rows` (1 + len(draft.tokens), V)
        after its next token and each drafted one decide which drafted tokens it keeps
        (runtime.generate.acceptance); its KV keeps the positions those tokens were fed at."""
        live: Running = self.runner.slots[slot].request
        job = live.job
        verdict = judge(rows, draft, live.chooser, job.sampling, self.softcap, live.generator)
        # Fed: the next token and the drafts; kept: it and the drafts that are now generated tokens.
        self.runner.accept(slot, max(1, len(verdict.tokens)))
        self.metrics.speculated(method, len(draft.tokens), verdict.accepted)
        for token, logprob in zip(verdict.tokens, verdict.logprobs, strict=True):
            if self._emit(slot, live, token, logprob):
                return
        if verdict.dead_end:
            self._dead_end(slot, live, GrammarDeadEnd("the grammar allows no token here"))

    def _emit(self, slot: int, live: Running, token: int, logprob: TokenLogprob | None) -> bool:
        """A token the choice generated: its text and logprobs to the request; True when it finished."""
        job = live.job
        now = time.perf_counter()
        (self.metrics.token_latency if live.generated else self.metrics.ttft).observe(now - live.last_time)
        self.metrics.tokens.inc()
        live.last_time, live.last = now, token
        live.generated += 1
        if live.context is not None:
            live.context.append(token)
        if logprob is not None:  # an end id's too, as vLLM gives it: one logprob per generated token
            live.logprobs.append(logprob)
        if live.chooser.ends_generation(token):  # an end id is not part of the reply's text
            self.finish(slot, "stop")
            return True
        text = live.text.push(token)
        if text:
            job.put(Delta(text, job.index, live.generated, tuple(live.logprobs)))
            live.logprobs.clear()
        if live.text.stopped:
            self.finish(slot, "stop")
        elif live.generated >= job.max_tokens:
            self.finish(slot, "length")
        else:
            return False
        return True

    def _dead_end(self, slot: int, live: Running, exc: GrammarDeadEnd) -> None:
        log.warning(
            "choice %d: its grammar allows nothing more after %d token(s) (%s); finishing it with %r",
            live.job.index,
            live.generated,
            exc,
            DEAD_END_REASON,
        )
        self.finish(slot, DEAD_END_REASON)

    def _force(self, live: Running, logits: torch.Tensor) -> None:
        """Teacher forcing: the logits score the prompt's next token, which is fed instead of a sampled
        one; once the prompt is in, its logprobs go out in one Delta and sampling starts."""
        job = live.job
        token = job.prompt[live.fed]
        assert job.prompt_logprobs is not None  # only a prompt whose logprobs are asked for is fed this way
        live.prompt_logprobs.append(prompt_logprob(logits, token, job.prompt_logprobs, self.softcap))
        live.fed += 1
        live.last = token
        if live.fed == len(job.prompt):
            job.put(Delta("", job.index, prompt_logprobs=tuple(live.prompt_logprobs)))
            live.prompt_logprobs.clear()

    def finish(self, slot: int, reason: str) -> None:
        """Free the slot and end the choice: what the detokeniser still holds, then its Finished."""
        live: Running = self.runner.slots[slot].request
        job = live.job
        self.runner.free(slot)
        if reason != "cancelled" and not live.text.stopped:
            rest = live.text.flush()
            if rest:
                job.put(Delta(rest, job.index, live.generated, tuple(live.logprobs)))
                live.logprobs.clear()
            if live.text.stopped:  # a stop string completed by the flush (one holding U+FFFD)
                reason = "stop"
        job.put(Finished(reason, len(job.prompt), live.generated, job.index, tuple(live.logprobs)))
