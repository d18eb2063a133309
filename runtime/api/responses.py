"""The Responses API's output over the chat pipeline: a Responses body becomes a chat request
(`responses_input.py`), which the chat route's own template, grammars and reply parser serve; the
reply's pieces come back here as Responses output items, whole or as the documented event stream.

Items: a `reasoning` item (the thought, as `reasoning_text` content), a `message` with one
`output_text` part, and a `function_call` per call, in the order the model wrote them. A reply cut
at `max_output_tokens` is `incomplete` (reason `max_output_tokens`), as OpenAI marks it. A stream is
`response.created`, `response.in_progress`, then per item `output_item.added`, its content part's
`content_part.added`, the deltas (`output_text.delta`, `reasoning_text.delta`,
`function_call_arguments.delta`), their `.done`, `content_part.done`, `output_item.done`, and last
`response.completed` (or `response.incomplete`; an engine failure is an `error` event and
`response.failed`)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from runtime.api.bodies import engine_failure
from runtime.api.openai_errors import APIError
from runtime.api.reply_parser import Content, Piece, Reasoning, ReplyParser, ToolCall
from runtime.api.responses_protocol import ResponsesRequest, ResponsesToolChoice
from runtime.generate.sequence import Delta, Failed, Job


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(prompt_tokens: int, output_tokens: int, reasoning_tokens: int) -> dict:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": prompt_tokens + output_tokens,
    }


@dataclass
class Meta:
    """What every Response object of one request repeats: the request's settings, echoed as OpenAI does."""

    body: ResponsesRequest
    model: str
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def response(self, status: str, output: list[dict], **extra) -> dict:
        b = self.body
        fmt = b.text.format.model_dump(by_alias=True, exclude_none=True) if b.text and b.text.format else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": output,
            "instructions": b.instructions,
            "tools": [t.model_dump(exclude_none=True) for t in b.tools or ()],
            "tool_choice": b.tool_choice.model_dump()
            if isinstance(b.tool_choice, ResponsesToolChoice)
            else b.tool_choice or "auto",
            "parallel_tool_calls": b.parallel_tool_calls is not False,
            "temperature": b.temperature,
            "top_p": b.top_p,
            "max_output_tokens": b.max_output_tokens,
            "text": {"format": fmt or {"type": "text"}},
            "reasoning": b.reasoning.model_dump(exclude_none=True) if b.reasoning else None,
            "metadata": b.metadata or {},
            "user": b.user,
            "store": False,
            "background": False,
            "previous_response_id": None,
            "truncation": "disabled",
            "error": None,
            "incomplete_details": None,
            "usage": None,
        } | extra


class Items:
    """The output items of one reply as its pieces arrive. `add` returns the stream events a piece
    makes (each a dict without its sequence number); `close` ends the open item."""

    def __init__(self) -> None:
        self.done: list[dict] = []  # finished items, in order
        self.open: dict | None = None  # the reasoning or message item text is still flowing into
        self.text: list[str] = []

    @property
    def index(self) -> int:
        return len(self.done)

    def add(self, piece: Piece) -> list[dict]:
        kind = "reasoning" if isinstance(piece, Reasoning) else "message" if isinstance(piece, Content) else "call"
        events = self.close() if self.open is not None and self.open["type"] != kind else []
        if isinstance(piece, ToolCall):
            return events + self.call(piece)
        if self.open is None:
            events += self.start(kind)
        self.text.append(piece.text)
        delta: dict[str, Any]
        if kind == "reasoning":
            delta = {"type": "response.reasoning_text.delta", "delta": piece.text}
        else:
            delta = {"type": "response.output_text.delta", "delta": piece.text, "logprobs": []}
        return events + [delta | self.where() | {"content_index": 0}]

    def where(self) -> dict:
        assert self.open is not None  # only asked while an item is open
        return {"item_id": self.open["id"], "output_index": self.index}

    def start(self, kind: str) -> list[dict]:
        part: dict[str, Any]
        if kind == "reasoning":
            self.open, part = {"type": "reasoning", "id": new_id("rs"), "summary": []}, {"type": "reasoning_text"}
        else:
            self.open = {"type": "message", "id": new_id("msg"), "role": "assistant"}
            part = {"type": "output_text", "annotations": [], "logprobs": []}
        self.text = []
        item = self.open | {"status": "in_progress", "content": []}
        return [
            {"type": "response.output_item.added", "output_index": self.index, "item": item},
            {"type": "response.content_part.added", "content_index": 0, "part": part | {"text": ""}} | self.where(),
        ]

    def close(self, status: str = "completed") -> list[dict]:
        if self.open is None:
            return []
        text, reasoning = "".join(self.text), self.open["type"] == "reasoning"
        part: dict[str, Any] = {"type": "reasoning_text" if reasoning else "output_text", "text": text}
        if not reasoning:
            part |= {"annotations": [], "logprobs": []}
        item = self.open | {"status": status, "content": [part]}
        kind = "reasoning_text" if reasoning else "output_text"
        done = {"type": f"response.{kind}.done", "content_index": 0, "text": text} | self.where()
        events = [
            done | ({} if reasoning else {"logprobs": []}),
            {"type": "response.content_part.done", "content_index": 0, "part": part} | self.where(),
            {"type": "response.output_item.done", "output_index": self.index, "item": item},
        ]
        self.done.append(item)
        self.open = None
        return events

    def call(self, call: ToolCall) -> list[dict]:
        item = {"type": "function_call", "id": new_id("fc"), "call_id": call.id, "name": call.name}
        where = {"item_id": item["id"], "output_index": self.index}
        events = [
            {"type": "response.output_item.added", "output_index": self.index}
            | {"item": item | {"arguments": "", "status": "in_progress"}},
            {"type": "response.function_call_arguments.delta", "delta": call.arguments} | where,
            {"type": "response.function_call_arguments.done", "arguments": call.arguments} | where,
        ]
        item |= {"arguments": call.arguments, "status": "completed"}
        self.done.append(item)
        return events + [{"type": "response.output_item.done", "output_index": where["output_index"], "item": item}]


class _Run:
    """One reply from the engine's events: its items, then the final Response object."""

    def __init__(self, job: Job, meta: Meta, parser: ReplyParser):
        self.job, self.meta, self.parser = job, meta, parser
        self.items = Items()
        self.reasoning_tokens = 0  # the tokens generated up to the last one that carried reasoning text

    def feed(self, event) -> list[dict]:
        """The events one engine event makes (Delta or Finished)."""
        pieces = self.parser.feed(event.text) if isinstance(event, Delta) else self.parser.finish()
        if any(isinstance(p, Reasoning) for p in pieces):
            self.reasoning_tokens = event.completion_tokens
        out = [e for p in pieces for e in self.items.add(p)]
        if isinstance(event, Delta):
            return out
        cut = event.reason == "length"
        out += self.items.close("incomplete" if cut else "completed")
        self.final = self.meta.response(
            "incomplete" if cut else "completed",
            self.items.done,
            usage=usage(len(self.job.prompt), event.completion_tokens, self.reasoning_tokens),
            incomplete_details={"reason": "max_output_tokens"} if cut else None,
        )
        return out


def whole(job: Job, meta: Meta, parser: ReplyParser, abandoned: Callable[[], bool] | None = None) -> dict:
    """The Response object of a request that does not stream."""
    run = _Run(job, meta, parser)
    for event in job.events(1, abandoned):
        if isinstance(event, Failed):
            job.cancel()
            raise engine_failure(meta.id, event)
        if not isinstance(event, Delta) and event.reason == "cancelled":
            raise APIError(499, "the client closed the connection before the answer was ready", code="client_closed")
        run.feed(event)
    return run.final


def sse(seq: int, event: dict) -> str:
    event = event | {"sequence_number": seq}
    return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n"


def stream(job: Job, meta: Meta, parser: ReplyParser) -> Iterator[str]:
    """The event stream of one response. Leaving early cancels the job."""
    run = _Run(job, meta, parser)
    seq = 0

    def emit(events: list[dict]) -> Iterator[str]:
        nonlocal seq
        for e in events:
            yield sse(seq, e)
            seq += 1

    try:
        begun = meta.response("in_progress", [])
        yield from emit(
            [{"type": "response.created", "response": begun}, {"type": "response.in_progress", "response": begun}]
        )
        for event in job.events(1):
            if isinstance(event, Failed):
                err = engine_failure(meta.id, event)
                error = {"code": err.code, "message": err.message}
                failed = meta.response("failed", run.items.done, error=error)
                yield from emit(
                    [{"type": "error", "param": None} | error, {"type": "response.failed", "response": failed}]
                )
                return
            yield from emit(run.feed(event))
        final = run.final
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        yield from emit([{"type": kind, "response": final}])
    finally:
        job.cancel()
