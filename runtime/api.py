"""The OpenAI API: /v1/models, /v1/completions, /v1/chat/completions, streamed (SSE) or not.

Bodies are validated by pydantic models (strict JSON types; unknown parameters are refused, not
ignored). A request becomes an engine Job only once its prompt and max_tokens are known to fit."""

from __future__ import annotations

import datetime
import functools
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any

from flask import Blueprint, Response, current_app, jsonify, request
from jinja2 import TemplateError
from pydantic import BaseModel, ConfigDict, Field, PlainValidator
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from .chat import ChatTemplateError, Message, Reply, Tool, ToolChoice, render
from .engine import Delta, DoesNotFit, Engine, Failed, Finished, Job, NotReady, QueueFull, State, token_budget
from .errors import APIError
from .reply import ReplyParser
from .sampling import SamplingParams

bp = Blueprint("openai", __name__, url_prefix="/v1")

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat defaults to the room left
MAX_STOPS = 16
RETRY_AFTER_S = "1"
_TOKENIZING = threading.Lock()


def _stops(value) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise ValueError("must be a non-empty string or a list of them")
    if len(stops) > MAX_STOPS:
        raise ValueError(f"{len(stops)} stop strings given, at most {MAX_STOPS} are allowed")
    return tuple(stops)


def _prompt(value) -> str | list[int]:
    if isinstance(value, str) or (isinstance(value, list) and value and all(type(t) is int for t in value)):
        return value
    raise ValueError("must be a string or a non-empty list of token ids")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class _Body(_Strict):
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)
    stop: Annotated[tuple[str, ...], PlainValidator(_stops)] | None = None
    n: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=1.0 if self.temperature is None else self.temperature,
                              top_p=1.0 if self.top_p is None else self.top_p, top_k=self.top_k or 0)


class ChatBody(_Body):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    skip_special_tokens: bool = True

    def parses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


class CompletionBody(_Body):
    prompt: Annotated[str | list[int], PlainValidator(_prompt)]


def ready_engine() -> Engine:
    eng: Engine = current_app.extensions["gemma4_engine"]
    if eng.state is not State.READY:
        retry = {"Retry-After": "5"} if eng.state is not State.FAILED else {}
        raise APIError(503, f"the model is not ready ({eng.state.value}: {eng.reason})", code="not_ready", headers=retry)
    return eng


def parse(model: type[BaseModel]) -> BaseModel:
    return model.model_validate_json(read_body())


def read_body() -> bytes:
    """The whole body, at most MAX_CONTENT_LENGTH bytes (413 beyond, chunked or not: werkzeug stops a
    chunked body at the limit without a word, so one byte more is asked for)."""
    try:
        data = request.get_data()  # a Content-Length over the limit is a 413 before any byte is read
        if request.content_length is None and len(data) >= current_app.config["MAX_CONTENT_LENGTH"] \
                and request.environ["wsgi.input"].read(1):
            raise RequestEntityTooLarge()
        return data
    except HTTPException:
        raise
    except TimeoutError as exc:
        raise APIError(408, str(exc), code="request_timeout") from None
    except Exception as exc:  # the server's parser refused the body's framing (a bad chunk size ...)
        raise APIError(400, f"the request body could not be read: {exc}", code="invalid_body") from None


@functools.lru_cache(maxsize=4)
def chars_per_token(tokenizer) -> int:
    """The most characters one token of this tokenizer stands for (its longest vocabulary entry), so a
    text of more than `tokens * chars_per_token` characters cannot be `tokens` tokens or fewer."""
    return max(len(t) for t in tokenizer.get_vocab())


def check_size(eng: Engine, texts: list[str], param: str) -> None:
    """Refuse what cannot fit before templating or tokenizing it (a 1 MB prompt took ~1 s of CPU to
    find out): at least one token per message, at most chars_per_token characters per token."""
    most = eng.geometry.kv_max - 1  # the longest prompt: one position stays for the first new token
    if len(texts) > most:
        raise APIError(400, f"{len(texts)} messages are more than a prompt of this model ({most} tokens at most) "
                       "can hold", param=param, code="context_length_exceeded")
    chars = sum(map(len, texts))
    if chars > most * chars_per_token(eng.tokenizer):
        raise APIError(400, f"the prompt has {chars} characters; a prompt of this model holds at most {most} "
                       f"tokens of at most {chars_per_token(eng.tokenizer)} characters each; prompts are "
                       "never truncated", param=param, code="context_length_exceeded")


def tokenize(encode):
    """One request tokenizes (or templates) at a time: each thread doing it competes with the engine
    thread for the interpreter, and 4 at once made a running stream's tokens 5x slower."""
    with _TOKENIZING:
        return encode()


def check_request(eng: Engine, body: _Body) -> None:
    if body.model != eng.model_name:
        raise APIError(404, f"model {body.model!r} does not exist; this server serves {eng.model_name!r}",
                       param="model", code="model_not_found")
    if body.n not in (None, 1):
        raise APIError(400, f"n: only n=1 is supported, got {body.n}", param="n", code="invalid_value")


def submit(eng: Engine, body: _Body, prompt: list[int], max_tokens: int | None, param: str,
           default: int | None = None, skip_special_tokens: bool = True) -> Job:
    try:
        budget = token_budget(eng.geometry, len(prompt), max_tokens, default)
    except DoesNotFit as exc:
        raise APIError(400, str(exc), param=param, code="context_length_exceeded") from None
    job = Job(prompt, budget, body.sampling(), body.stop or (), body.seed, skip_special_tokens)
    try:
        return eng.submit(job)
    except QueueFull as exc:
        raise APIError(503, str(exc), code="queue_full", headers={"Retry-After": RETRY_AFTER_S}) from None
    except NotReady as exc:  # it began to drain or failed since ready_engine()
        raise APIError(503, str(exc), code="not_ready", headers={"Retry-After": RETRY_AFTER_S}) from None


# -- models ------------------------------------------------------------------------------------------
def model_card(eng: Engine) -> dict:
    created = int(datetime.datetime.fromisoformat(eng.model.meta.created).timestamp())
    return {"id": eng.model_name, "object": "model", "created": created, "owned_by": "gemma4-inf2"}


@bp.get("/models")
def list_models():
    return jsonify({"object": "list", "data": [model_card(ready_engine())]})


@bp.get("/models/<path:model_id>")
def get_model(model_id: str):
    eng = ready_engine()
    if model_id != eng.model_name:
        raise APIError(404, f"model {model_id!r} does not exist; this server serves {eng.model_name!r}",
                       param="model", code="model_not_found")
    return jsonify(model_card(eng))


# -- completions -------------------------------------------------------------------------------------
@bp.post("/chat/completions")
def chat_completions():
    body: ChatBody = parse(ChatBody)
    eng = ready_engine()
    check_request(eng, body)
    check_size(eng, [m.content or "" for m in body.messages], "messages")
    try:
        text = tokenize(lambda: render(eng.tokenizer, body.messages, body.tools, body.tool_choice,
                                       body.chat_template_kwargs))
    except ChatTemplateError as exc:
        raise APIError(400, f"{exc.param}: {exc}", param=exc.param, code="invalid_value") from None
    except TemplateError as exc:
        raise APIError(400, f"messages: the model's chat template refused them: {exc}", param="messages") from None
    prompt = tokenize(lambda: eng.tokenizer(text, add_special_tokens=False).input_ids)  # the template writes <bos>
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    # The reply's parser needs the special tokens as boundaries; it drops them from what it passes on.
    job = submit(eng, body, list(prompt), max_tokens, "messages", skip_special_tokens=False)
    parser = ReplyParser(eng.tokenizer, text, body.parses_tools(), body.skip_special_tokens)
    return respond(job, body, _Shape(eng.model_name, parser))


@bp.post("/completions")
def completions():
    body: CompletionBody = parse(CompletionBody)
    eng = ready_engine()
    check_request(eng, body)
    if isinstance(body.prompt, str):
        check_size(eng, [body.prompt], "prompt")
        prompt = tokenize(lambda: eng.tokenizer(body.prompt).input_ids)
    else:
        prompt = body.prompt
        vocab = eng.geometry.vocab
        if not all(0 <= t < vocab for t in prompt):
            raise APIError(400, f"prompt: token ids must be in [0, {vocab})", param="prompt", code="invalid_value")
    job = submit(eng, body, list(prompt), body.max_tokens, "prompt", COMPLETIONS_DEFAULT_MAX_TOKENS)
    return respond(job, body, _Shape(eng.model_name))


# -- responses ---------------------------------------------------------------------------------------
class _Shape:
    """The parts of a response that differ between chat and text completions. A chat reply goes
    through its parser: reasoning, content and tool calls, as whole messages or stream deltas."""

    def __init__(self, model: str, parser: ReplyParser | None = None):
        self.chat, self.model, self.parser = parser is not None, model, parser
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.reply = Reply()
        self.text: list[str] = []

    def envelope(self, choices: list, chunk: bool, **extra) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices} | extra

    def deltas(self, text: str, end: bool = False) -> list[dict]:
        """What a piece of generated text adds: a chat delta per reply piece, or the completion text.
        At the end, what the chat parser still held."""
        if not self.chat:
            self.text.append(text)
            return [{"text": text}] if text else []
        pieces = self.parser.feed(text) if text else []
        return [self.reply.add(p) for p in pieces + (self.parser.finish() if end else [])]

    def finish_reason(self, reason: str) -> str:
        return self.reply.finish_reason(reason) if self.chat else reason

    def chunk(self, delta: dict | None, finish: str | None = None) -> dict:
        body = ({"delta": delta or {}} if self.chat else {"text": (delta or {}).get("text", "")})
        return self.envelope([{"index": 0} | body | {"logprobs": None, "finish_reason": finish}], chunk=True)

    def whole(self, finish: str) -> dict:
        body = {"message": self.reply.message()} if self.chat else {"text": "".join(self.text)}
        return {"index": 0} | body | {"logprobs": None, "finish_reason": self.finish_reason(finish)}


def usage(done: Finished) -> dict:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens}


def client_gone(environ) -> Callable[[], bool]:
    """Whether the client closed its connection while a whole answer is being made: its socket (which
    gunicorn hands the app) reads as closed. A stream notices by failing to write instead."""
    sock = environ.get("gunicorn.socket")

    def gone() -> bool:
        if sock is None:
            return False
        try:
            return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    return gone


def respond(job: Job, body: _Body, shape: _Shape):
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return Response(stream(job, shape, include_usage), mimetype="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    for event in job.events(abandoned=client_gone(request.environ)):
        if isinstance(event, Delta):
            shape.deltas(event.text)
        elif isinstance(event, Failed):
            raise APIError(503, f"generation failed: {event.message}", code="engine_error")
        else:
            done = event
    if done.reason == "cancelled":  # nobody reads this; the access log shows nginx's "client closed" status
        raise APIError(499, "the client closed the connection before the answer was ready", code="client_closed")
    shape.deltas("", end=True)
    return jsonify(shape.envelope([shape.whole(done.reason)], chunk=False, usage=usage(done)))


def sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, separators=(',', ':'))}\n\n"


def stream(job: Job, shape: _Shape, include_usage: bool):
    """SSE chunks, then `data: [DONE]`. Leaving early (the client went away: the server closes this
    generator) cancels the job, which frees its slot."""
    try:
        if shape.chat:
            yield sse(shape.chunk({"role": "assistant", "content": ""}))
        for event in job.events():
            if isinstance(event, Delta):
                for delta in shape.deltas(event.text):
                    yield sse(shape.chunk(delta))
            elif isinstance(event, Failed):
                yield sse(APIError(503, f"generation failed: {event.message}", code="engine_error").body())
                return
            else:
                for delta in shape.deltas("", end=True):
                    yield sse(shape.chunk(delta))
                yield sse(shape.chunk(None, shape.finish_reason(event.reason)))
                if include_usage:
                    yield sse(shape.envelope([], chunk=True, usage=usage(event)))
        yield sse("[DONE]")
    finally:
        job.cancel()
