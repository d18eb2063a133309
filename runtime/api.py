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
from typing import Annotated, Literal

from flask import Blueprint, Response, current_app, jsonify, request
from jinja2 import TemplateError
from pydantic import BaseModel, ConfigDict, Field, PlainValidator
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from .engine import Delta, DoesNotFit, Engine, Failed, Finished, Job, NotReady, QueueFull, State, token_budget
from .errors import APIError
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


def _content(value) -> str:
    """A string, or OpenAI's list of content parts, of which only text is supported."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                                       for p in value):
        return "".join(p["text"] for p in value)
    raise ValueError("must be a string or a list of {\"type\": \"text\", \"text\": ...} parts (only text is supported)")


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


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Annotated[str, PlainValidator(_content)]
    name: str | None = None

    def template_dict(self) -> dict:
        return {"role": "system" if self.role == "developer" else self.role, "content": self.content}


class ChatBody(_Body):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


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
    most = eng.geometry.buckets[-1]
    if len(texts) > most:
        raise APIError(400, f"{len(texts)} messages are more than the largest prefill bucket of this model "
                       f"({most} tokens) can hold", param=param, code="context_length_exceeded")
    chars = sum(map(len, texts))
    if chars > most * chars_per_token(eng.tokenizer):
        raise APIError(400, f"the prompt has {chars} characters; the largest prefill bucket of this model holds "
                       f"{most} tokens of at most {chars_per_token(eng.tokenizer)} characters each; prompts are "
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
           default: int | None = None) -> Job:
    try:
        budget = token_budget(eng.geometry, len(prompt), max_tokens, default)
    except DoesNotFit as exc:
        raise APIError(400, str(exc), param=param, code="context_length_exceeded") from None
    job = Job(prompt, budget, body.sampling(), body.stop or (), body.seed)
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
    check_size(eng, [m.content for m in body.messages], "messages")
    try:
        prompt = tokenize(lambda: eng.tokenizer.apply_chat_template(
            [m.template_dict() for m in body.messages], add_generation_prompt=True, tokenize=True, return_dict=False))
    except TemplateError as exc:
        raise APIError(400, f"messages: the model's chat template refused them: {exc}", param="messages") from None
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    job = submit(eng, body, list(prompt), max_tokens, "messages")
    return respond(job, body, eng.model_name, chat=True)


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
    return respond(job, body, eng.model_name, chat=False)


# -- responses ---------------------------------------------------------------------------------------
class _Shape:
    """The parts of a response that differ between chat and text completions."""

    def __init__(self, chat: bool, model: str):
        self.chat, self.model = chat, model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def envelope(self, choices: list, chunk: bool, **extra) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices} | extra

    def choice(self, text: str | None, finish: str | None, chunk: bool, first: bool = False) -> dict:
        out: dict = {"index": 0}
        if not self.chat:
            out["text"] = text or ""
        elif chunk:
            out["delta"] = ({"role": "assistant", "content": ""} if first else {}) | (
                {"content": text} if text is not None else {})
        else:
            out["message"] = {"role": "assistant", "content": text}
        return out | {"logprobs": None, "finish_reason": finish}


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


def respond(job: Job, body: _Body, model: str, chat: bool):
    shape = _Shape(chat, model)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return Response(stream(job, shape, include_usage), mimetype="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    parts = []
    for event in job.events(abandoned=client_gone(request.environ)):
        if isinstance(event, Delta):
            parts.append(event.text)
        elif isinstance(event, Failed):
            raise APIError(503, f"generation failed: {event.message}", code="engine_error")
        else:
            done = event
    if done.reason == "cancelled":  # nobody reads this; the access log shows nginx's "client closed" status
        raise APIError(499, "the client closed the connection before the answer was ready", code="client_closed")
    return jsonify(shape.envelope([shape.choice("".join(parts), done.reason, chunk=False)], chunk=False,
                                  usage=usage(done)))


def sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, separators=(',', ':'))}\n\n"


def stream(job: Job, shape: _Shape, include_usage: bool):
    """SSE chunks, then `data: [DONE]`. Leaving early (the client went away: the server closes this
    generator) cancels the job, which frees its slot."""
    try:
        if shape.chat:
            yield sse(shape.envelope([shape.choice(None, None, chunk=True, first=True)], chunk=True))
        for event in job.events():
            if isinstance(event, Delta):
                yield sse(shape.envelope([shape.choice(event.text, None, chunk=True)], chunk=True))
            elif isinstance(event, Failed):
                yield sse(APIError(503, f"generation failed: {event.message}", code="engine_error").body())
                return
            else:
                yield sse(shape.envelope([shape.choice(None, event.reason, chunk=True)], chunk=True))
                if include_usage:
                    yield sse(shape.envelope([], chunk=True, usage=usage(event)))
        yield sse("[DONE]")
    finally:
        job.cancel()
