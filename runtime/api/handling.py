"""What every generating route does with a request: read and validate its body, check the model it
names, compile its output constraint, submit it to the engine as Jobs (one per choice) and answer,
streamed (SSE) or whole. A request becomes Jobs only once its prompt (rendering.py: templated and
checked against the context) and max_tokens are known to fit and its grammar compiles."""

from __future__ import annotations

import functools
import logging
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from flask import Response, current_app, jsonify, request
from pydantic import BaseModel
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from runtime.api.bodies import ResponseSpec, stream, whole
from runtime.api.caps import check_costs, check_total, default_budget
from runtime.api.chat import chat_call, template_kwargs, tool_names
from runtime.api.chat_protocol import ChatCompletionRequest
from runtime.api.media_prompt import MediaPart
from runtime.api.media_request import expand_media, prepare_media
from runtime.api.openai_errors import RETRY_AFTER_S, APIError
from runtime.api.protocol import GenerationRequest, StreamOptions, ignored_fields
from runtime.api.rendering import check_size, render_prompt, template_errors
from runtime.api.reply_parser import ReplyParser
from runtime.api.state import server_state
from runtime.api.tool_grammar import forced
from runtime.bounded import Busy
from runtime.generate.engine import Engine, NotReady, QueueFull, State
from runtime.generate.grammar import Grammar, GrammarError, GrammarMatcher
from runtime.generate.grammar_checks import GrammarLimitError
from runtime.generate.sequence import DoesNotFit, Job, token_budget
from runtime.log_gate import shown
from runtime.model.media import MediaInput

log = logging.getLogger("gemma4.api")

Body = TypeVar("Body", bound=BaseModel)


def ready_engine() -> Engine:
    eng = server_state().engine
    if eng.state is not State.READY:
        retry = {"Retry-After": "5"} if eng.state is not State.FAILED else {}
        raise APIError(
            503, f"the model is not ready ({eng.state.value}: {eng.reason})", code="not_ready", headers=retry
        )
    return eng


def parse(model: type[Body]) -> Body:
    """The request's body as `model`; the fields it ignores are logged once per name."""
    body = model.model_validate_json(read_body())
    server_state().log_ignored(ignored_fields(body))
    return body


def read_body() -> bytes:
    """The whole body, at most MAX_CONTENT_LENGTH bytes (413 beyond, chunked or not: werkzeug stops a
    chunked body at the limit without a word, so one byte more is asked for)."""
    try:
        data = request.get_data()  # a Content-Length over the limit is a 413 before any byte is read
        if (
            request.content_length is None
            and len(data) >= current_app.config["MAX_CONTENT_LENGTH"]
            and request.environ["wsgi.input"].read(1)
        ):
            raise RequestEntityTooLarge()
        return data
    except HTTPException:
        raise
    except TimeoutError as exc:
        raise APIError(408, str(exc), code="request_timeout") from None
    except Exception as exc:  # noqa: BLE001 - the server's parser refused the body's framing (a bad chunk size ...)
        raise APIError(400, f"the request body could not be read: {exc}", code="invalid_body") from None


def check_model(eng: Engine, model: str | None) -> None:
    """A request naming a model names this server's (None: it named none, where that is allowed)."""
    if model is not None and model != eng.model_name:
        raise APIError(
            404,
            f"model {shown(model)} does not exist; this server serves {eng.model_name!r}",
            param="model",
            code="model_not_found",
        )


def compile_grammar(
    eng: Engine, body: GenerationRequest, imposed: tuple[str, Grammar] | None = None
) -> GrammarMatcher | None:
    """The request's output constraint compiled for the engine; `imposed` is one the server imposes
    (a tool call), named by the field that asked for it."""
    asked = body.grammar()
    if asked is not None and imposed is not None:
        raise APIError(400, f"{asked[0]}: cannot be combined with {imposed[0]}", param=asked[0], code="invalid_value")
    asked = asked or imposed
    if asked is None:
        return None
    param, grammar = asked
    try:
        return eng.grammars.get().compile(grammar)
    except GrammarLimitError as exc:
        raise APIError(400, f"{param}: {exc}", param=param, code="over_limit") from None
    except GrammarError as exc:
        raise APIError(
            400, f"{param}: the grammar engine refused it: {exc}", param=param, code="invalid_value"
        ) from None
    except Busy as exc:
        raise APIError(503, str(exc), code="busy", headers={"Retry-After": RETRY_AFTER_S}) from None


def submit(
    eng: Engine,
    body: GenerationRequest,
    prompt: list[int],
    max_tokens: int | None,
    param: str,
    default: int | None = None,
    skip_special_tokens: bool = True,
    imposed: tuple[str, Grammar] | None = None,
    media: tuple[MediaInput, ...] = (),
) -> Job:
    if not prompt:
        raise APIError(400, f"{param}: the prompt is empty (no tokens to start from)", param=param, code="empty_prompt")
    limits, runs = server_state().limits, body.runs()
    if max_tokens is not None:
        check_total(runs, max_tokens, limits)
    cap = default_budget(runs, limits)  # without max_tokens: the route's default, or the room left, capped
    try:
        budget = token_budget(eng.geometry, len(prompt), max_tokens, cap if default is None else min(default, cap))
    except DoesNotFit as exc:
        raise APIError(400, str(exc), param=param, code="context_length_exceeded") from None
    job = Job(
        prompt,
        budget,
        body.sampling(),
        body.stop or (),
        body.seed,
        controls=body.controls(eng.geometry.vocab),
        grammar=compile_grammar(eng, body, imposed),
        skip_special_tokens=skip_special_tokens,
        prompt_logprobs=body.prompt_alternatives(),
        media=media,
        speculate=not body.disable_spec_decode,
    )
    try:
        return eng.submit(job, runs)
    except QueueFull as exc:
        raise APIError(503, str(exc), code="queue_full", headers={"Retry-After": RETRY_AFTER_S}) from None
    except NotReady as exc:  # it began to drain or failed since ready_engine()
        raise APIError(503, str(exc), code="not_ready", headers={"Retry-After": RETRY_AFTER_S}) from None


def token_bytes(eng: Engine) -> Callable[[int], bytes]:
    return lambda tid: eng.grammars.get().tokenizer.decode_bytes([tid])


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


def event_stream(events: Iterator[str]) -> Response:
    return Response(
        events, mimetype="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


def respond(jobs: list[Job], body: GenerationRequest, specs: list[ResponseSpec]) -> Response:
    """The answer to jobs[i] shaped by specs[i] (one per prompt), streamed or whole."""
    if body.stream:
        opts = body.stream_options or StreamOptions()
        return event_stream(stream(jobs, specs, body.n, opts.include_usage, opts.continuous_usage_stats))
    return jsonify(whole(jobs, specs, body.n, body.runs(), abandoned=client_gone(request.environ)))


@dataclass(frozen=True)
class ChatRun:
    """A chat request submitted: its job and a factory of the reply's parser."""

    job: Job
    parser: Callable[[], ReplyParser]


def start_chat(eng: Engine, body: ChatCompletionRequest, media: tuple[list[MediaPart], str] | None = None) -> ChatRun:
    """Template, tokenize and submit a chat request (the chat and the Responses routes both do).
    `media`: the request's media parts and the field that holds them as another API's body named them
    (the Responses request's input.N.content.M), when `body` is that request converted to chat."""
    check_model(eng, body.model)
    state = server_state()
    check_costs(body, state.limits)
    check_size(eng, [m.text() for m in body.messages], "messages")
    names = tool_names(body.tools, body.messages)  # aliases for names Gemma's call syntax cannot carry
    parts, where = (body.media_parts(), "messages") if media is None else media
    items = prepare_media(eng, parts, where)
    with template_errors():
        call = chat_call(
            eng.tokenizer, body.messages, body.tools, body.tool_choice, body.chat_template_kwargs, names, state.limits
        )
    text = render_prompt(eng, call)
    with state.tokenizer_lock:
        prompt = eng.tokenizer(text, add_special_tokens=False).input_ids  # the template writes <bos>
    prompt, inputs = expand_media(eng, prompt, items, where)
    with template_errors():  # a tool schema the grammar cannot follow, or one past a cap, is a 400 too
        thinking = template_kwargs(body.chat_template_kwargs, state.limits).get("enable_thinking") is True
        limits = eng.settings.grammar_limits
        grammar = forced(eng.tokenizer, body.tools, body.tool_choice, body.parallel_tool_calls, limits, names, thinking)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    # The reply's parser needs the special tokens as boundaries; it drops them from what it passes on.
    job = submit(
        eng, body, prompt, max_tokens, "messages", skip_special_tokens=False, imposed=grammar, media=tuple(inputs)
    )
    parser = functools.partial(
        ReplyParser, eng.tokenizer, text, body.parses_tools(), body.skip_special_tokens, names=names
    )
    return ChatRun(job, parser)
