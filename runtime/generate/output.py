"""What a model step means for the choice in a slot: the next token chosen from the slot's logits, the
text it completes (stop strings, detokenisation), its logprobs, teacher forcing of a prompt whose
logprobs are asked for, and the events that carry all of it to the request (engine thread only)."""

from __future__ import annotations

import logging
import time

import torch

from runtime.generate.detok import TextStream
from runtime.generate.grammar import GrammarDeadEnd
from runtime.generate.logits import TokenChooser
from runtime.generate.logprobs import prompt_logprob
from runtime.generate.sequence import Delta, Finished, Job, Running
from runtime.metrics import Metrics
from runtime.model.loader import LoadedModel

log = logging.getLogger("gemma4.engine")

# How a choice ends when its grammar can go no further: as vLLM reports a structured output that has
# ended, "stop" (the text so far is what the grammar allowed); the server log says why.
DEAD_END_REASON = "stop"


class OutputProcessor:
    def __init__(self, model: LoadedModel, metrics: Metrics):
        self.model = model
        self.runner = model.runner
        self.metrics = metrics
        self.softcap = model.meta.geometry.softcap

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
        return Running(job, text, generator, chooser, job.accepted)

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
            log.warning(
                "choice %d: its grammar allows nothing more after %d token(s) (%s); finishing it with %r",
                job.index,
                live.generated,
                exc,
                DEAD_END_REASON,
            )
            return self.finish(slot, DEAD_END_REASON)
        now = time.perf_counter()
        (self.metrics.token_latency if live.generated else self.metrics.ttft).observe(now - live.last_time)
        self.metrics.tokens.inc()
        live.last_time, live.last = now, token
        live.generated += 1
        if logprob is not None:  # an end id's too, as vLLM gives it: one logprob per generated token
            live.logprobs.append(logprob)
        if live.chooser.ends_generation(token):  # an end id is not part of the reply's text
            return self.finish(slot, "stop")
        text = live.text.push(token)
        if text:
            job.put(Delta(text, job.index, live.generated, tuple(live.logprobs)))
            live.logprobs.clear()
        if live.text.stopped:
            self.finish(slot, "stop")
        elif live.generated >= job.max_tokens:
            self.finish(slot, "length")
        return None

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
