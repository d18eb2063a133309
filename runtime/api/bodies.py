"""OpenAI response bodies and SSE chunks from engine events: n choices, logprobs, usage, echo.

The engine's events carry each choice's text, its logprobs and its token count. A chat choice's text
goes through its own reply parser (reasoning, content, tool calls: runtime.api.reply_parser and runtime.api.chat);
this module shapes the result as OpenAI's chat and text completions do, with vLLM's extensions
(`continuous_usage_stats`); the logprobs inside a choice are logprob_bodies.py's."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.api.chat_reply import Reply
from runtime.api.logprob_bodies import TokenBytes, chat_logprobs, completion_logprobs, vllm_prompt_logprobs
from runtime.api.openai_errors import APIError
from runtime.api.reply_parser import ReplyParser
from runtime.generate.logprobs import TokenLogprob
from runtime.generate.sequence import Delta, Failed, Finished, Job

log = logging.getLogger("gemma4.api")


@dataclass
class ResponseSpec:
    """How one request's response is shaped. `parser` makes a chat choice's reply parser (None: a
    text completion)."""

    model: str
    token_bytes: TokenBytes
    parser: Callable[[], ReplyParser] | None = None
    logprobs: bool = False
    named_tool: bool = False  # chat: a named tool_choice forced the call (its finish_reason is stop)
    echo: str = ""  # completions: the prompt, shown before each choice's text
    echo_logprobs: int | None = None  # completions: alternatives per echoed prompt token in `logprobs`
    prompt_logprobs: int | None = None  # vLLM's `prompt_logprobs`: alternatives per prompt token
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def chat(self) -> bool:
        return self.parser is not None

    def __post_init__(self):
        self.id = self.id or f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"

    def envelope(self, choices: list, chunk: bool, **extra) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices} | extra


class _Choice:
    """One choice as it accumulates: the chat reply (or the completion's text), logprobs not yet
    shown, the finish, and the completions text offset."""

    def __init__(self, spec: ResponseSpec, index: int, prompt: list[int]):
        self.spec, self.index = spec, index
        self.parser = None if spec.parser is None else spec.parser()
        self.reply = Reply()
        self.text: list[str] = [spec.echo]
        self.entries: list[TokenLogprob] = []  # every logprob (a whole response)
        self.pending: list[TokenLogprob] = []  # logprobs no chunk has carried yet (a stream)
        self.prompt = [TokenLogprob(prompt[0], None, ())]  # the prompt's logprobs (if asked for), as they come
        self.echoed = False  # a stream: the echo chunk went out
        # With the prompt's tokens in `logprobs`, the offsets run through them, as vLLM counts them.
        self.offset = 0 if spec.echo_logprobs is not None else len(spec.echo)
        self.tokens = 0
        self.finish: str | None = None

    def deltas(self, text: str, end: bool = False) -> list[dict]:
        """What a piece of generated text adds: a chat delta per reply piece, or the completion text.
        At the end, what the chat parser still held."""
        if self.parser is None:
            self.text.append(text)
            return [{"text": text}] if text else []
        pieces = self.parser.feed(text) if text else []
        return [self.reply.add(p) for p in pieces + (self.parser.finish() if end else [])]

    def take(self, event: Delta | Finished) -> None:
        """An event's logprobs and the choice's token count."""
        if isinstance(event, Delta):
            self.prompt.extend(event.prompt_logprobs)
        self.entries.extend(event.logprobs)
        self.pending.extend(event.logprobs)
        self.tokens = event.completion_tokens

    def echoed_logprobs(self) -> list[TokenLogprob]:
        """The prompt's entries that `logprobs` shows before the generated ones (echo with logprobs)."""
        k = self.spec.echo_logprobs
        return [] if k is None else [dataclasses.replace(e, top=e.top[:k]) for e in self.prompt]

    def logprobs(self, entries) -> dict | None:
        if not self.spec.logprobs:
            return None
        if self.spec.chat:
            return chat_logprobs(entries, self.spec.token_bytes)
        out, self.offset = completion_logprobs(entries, self.spec.token_bytes, self.offset)
        return out

    def finish_reason(self, reason: str) -> str:
        return self.reply.finish_reason(reason, self.spec.named_tool) if self.spec.chat else reason

    def prompt_logprobs(self) -> list:
        return vllm_prompt_logprobs(self.prompt, self.spec.prompt_logprobs or 0, self.spec.token_bytes)

    def whole(self) -> dict:
        assert self.finish is not None, "a whole response is made once every choice has finished"
        body = {"message": self.reply.message()} if self.spec.chat else {"text": "".join(self.text)}
        out: dict[str, Any] = (
            {"index": self.index}
            | body
            | {
                "logprobs": self.logprobs(self.echoed_logprobs() + self.entries),
                "finish_reason": self.finish_reason(self.finish),
            }
        )
        if self.spec.prompt_logprobs is not None and not self.spec.chat:  # vLLM: per choice in completions
            out["prompt_logprobs"] = self.prompt_logprobs()
        return out

    def chunk(self, delta: dict | None, finish: str | None = None) -> dict:
        """One stream choice, carrying the logprobs that came since the last chunk."""
        body = {"delta": delta or {}} if self.spec.chat else {"text": (delta or {}).get("text", "")}
        entries, self.pending = self.pending, []
        lp = self.logprobs(entries) if entries else None
        return {"index": self.index} | body | {"logprobs": lp, "finish_reason": finish}


def engine_failure(request_id: str, event: Failed) -> APIError:
    """A request the engine could not finish: a server log line with the reason, and the error for the
    client (a 503 to retry elsewhere when the engine stopped or failed under it; a 400 when its own
    input was at fault)."""
    log.log(
        logging.ERROR if event.status >= 500 else logging.WARNING,
        "%s: generation failed: %s",
        request_id,
        event.message,
    )
    code = "invalid_value" if event.status < 500 else "engine_error"
    return APIError(event.status, f"generation failed: {event.message}", code=code)


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def whole(
    jobs: Sequence[Job],
    specs: Sequence[ResponseSpec],
    n: int,
    runs: int | None = None,
    abandoned: Callable[[], bool] | None = None,
) -> dict:
    """The response body of a request that does not stream: every choice run to its end. With
    `runs` > n (best_of), the n runs of the highest cumulative logprob are the choices. Several
    prompts (jobs[i] with specs[i]): prompt i's choice j is index i * n + j, as OpenAI numbers a
    batch, and usage sums them all."""
    runs = runs or n
    out: list[_Choice] = []
    tokens = 0  # every run counts, as OpenAI bills best_of
    try:
        for i, (job, spec) in enumerate(zip(jobs, specs, strict=True)):
            choices = _run_whole(job, spec, runs, abandoned)
            tokens += sum(c.tokens for c in choices)
            if runs > n:
                choices = sorted(choices, key=lambda c: -sum(e.logprob or 0.0 for e in c.entries))[
                    :n
                ]  # generated: never None
            for j, c in enumerate(choices):
                c.index = i * n + j
            out += choices
    finally:  # a failed prompt withdraws the others
        for job in jobs:
            job.cancel()
    spec = specs[0]
    prompt_tokens = sum(len(job.prompt) for job in jobs)
    extra = {"prompt_logprobs": out[0].prompt_logprobs()} if spec.chat and spec.prompt_logprobs is not None else {}
    return spec.envelope([c.whole() for c in out], chunk=False, usage=usage(prompt_tokens, tokens), **extra)


def _run_whole(job: Job, spec: ResponseSpec, runs: int, abandoned: Callable[[], bool] | None) -> list[_Choice]:
    """One prompt's runs, each to its end."""
    choices = [_Choice(spec, i, job.prompt) for i in range(runs)]
    for event in job.events(runs, abandoned):
        if isinstance(event, Failed):
            raise engine_failure(spec.id, event)
        c = choices[event.index]
        c.take(event)
        if isinstance(event, Delta):
            c.deltas(event.text)
        else:
            c.finish = event.reason
            c.deltas("", end=True)
    if any(c.finish == "cancelled" for c in choices):  # nobody reads this; the access log shows "client closed"
        raise APIError(499, "the client closed the connection before the answer was ready", code="client_closed")
    return choices


def sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, separators=(',', ':'))}\n\n"


def stream(
    jobs: Sequence[Job], specs: Sequence[ResponseSpec], n: int, include_usage: bool, continuous_usage: bool
) -> Iterator[str]:
    """SSE chunks, then `data: [DONE]`; several prompts one after another (prompt i's choice j is
    index i * n + j). Leaving early (the client went away: the server closes this generator) cancels
    the jobs, which frees their slots."""
    prompt_tokens = sum(len(job.prompt) for job in jobs)
    begun: list[_Choice] = []  # the choices of every prompt streamed so far

    def chunk(choice_list: list, **extra) -> str:
        if continuous_usage:
            extra = {"usage": usage(prompt_tokens, sum(c.tokens for c in begun))} | extra
        return sse(specs[0].envelope(choice_list, chunk=True, **extra))

    try:
        for i, (job, spec) in enumerate(zip(jobs, specs, strict=True)):
            choices = [_Choice(spec, i * n + j, job.prompt) for j in range(n)]
            begun += choices
            for c in choices:
                if spec.chat:
                    yield chunk([c.chunk({"role": "assistant", "content": ""})])
            for event in job.events(n):
                if isinstance(event, Failed):  # after the 200: OpenAI's error event, which its clients raise
                    yield sse(engine_failure(spec.id, event).body())
                    return
                c = choices[event.index]
                c.take(event)
                if spec.echo and not c.echoed:  # the prompt, with its logprobs if asked for, before any token
                    c.echoed, generated, c.pending = True, c.pending, c.echoed_logprobs()
                    yield chunk([c.chunk({"text": spec.echo})])
                    c.pending = generated
                if isinstance(event, Finished):
                    for delta in c.deltas("", end=True):
                        yield chunk([c.chunk(delta)])
                    yield chunk([c.chunk(None, c.finish_reason(event.reason))])
                else:
                    for delta in c.deltas(event.text):
                        yield chunk([c.chunk(delta)])
        if include_usage:
            yield sse(specs[0].envelope([], chunk=True, usage=usage(prompt_tokens, sum(c.tokens for c in begun))))
        yield sse("[DONE]")
    finally:
        for job in jobs:
            job.cancel()
