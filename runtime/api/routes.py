"""The OpenAI API: /v1/models, /v1/completions, /v1/chat/completions, streamed (SSE) or not, and
vLLM's /tokenize and /detokenize.

Bodies are validated by pydantic models with vLLM's field policy: a field this server knows is
checked strictly (a bad value is a 400 naming it); a field it does not know is accepted and ignored,
and logged once per name. A request becomes engine Jobs (one per choice) only once its prompt and
max_tokens are known to fit and its grammar compiles."""

from __future__ import annotations

import datetime
import functools
import logging
import socket
import threading
from collections.abc import Callable
from typing import Annotated, Any, Literal

from flask import Blueprint, Response, current_app, jsonify, request
from jinja2 import TemplateError
from pydantic import BaseModel, ConfigDict, Field, PlainValidator
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from runtime.api.bodies import Shape, stream, whole
from runtime.api.chat import ChatTemplateError, Message, Tool, ToolChoice, ToolChoiceFunction, render
from runtime.api.errors import APIError
from runtime.api.reply_parser import ReplyParser
from runtime.api.tool_grammar import forced
from runtime.generate.engine import DoesNotFit, Engine, Job, NotReady, QueueFull, State, token_budget
from runtime.generate.grammar import Grammar, GrammarError
from runtime.generate.logits import Controls
from runtime.generate.sampling import SamplingParams

bp = Blueprint("openai", __name__, url_prefix="/v1")
vllm_bp = Blueprint("vllm", __name__)  # vLLM's routes outside /v1
log = logging.getLogger("gemma4.api")

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat defaults to the room left
MAX_STOPS = 16
MAX_CHOICES = 128  # OpenAI's limit on n
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
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]  # a batch of one, as lm-evaluation-harness sends token ids
    if isinstance(value, str) or (isinstance(value, list) and value and all(type(t) is int for t in value)):
        return value
    raise ValueError(
        "must be a string, a non-empty list of token ids, or a list of one of them (one prompt per "
        "request: this server does not take a batch of prompts)"
    )


class _Lenient(BaseModel):
    """Known fields strictly typed; unknown ones kept aside (model_extra) to be logged and ignored."""

    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)


_logged: set[str] = set()
_logged_lock = threading.Lock()


def ignored_fields(model: BaseModel, prefix: str = "") -> list[str]:
    """Dotted names of the fields a client sent that this server does not know (list items as `[]`)."""
    names = [prefix + k for k in (model.model_extra or {})]
    for name in type(model).model_fields:
        value = getattr(model, name)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, BaseModel):
                names += ignored_fields(item, f"{prefix}{name}{'[]' if isinstance(value, list) else ''}.")
    return names


def log_ignored(model: BaseModel) -> None:
    for name in ignored_fields(model):
        with _logged_lock:
            if name in _logged:
                continue
            _logged.add(name)
        log.warning("request field %r is not supported and is ignored (logged once)", name)


class StreamOptions(_Lenient):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM: usage in every chunk


class JsonSchemaFormat(_Lenient):
    name: str = "response"
    schema_: dict | bool = Field(default_factory=dict, alias="schema")
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(_Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Lenient):
    """vLLM's `structured_outputs` (its older spelling: the `guided_*` fields)."""

    json_: dict | bool | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = Field(default=None, min_length=1)
    grammar: str | None = None  # llguidance's Lark dialect (vLLM takes EBNF here)


class _Body(_Lenient):
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)  # -1 (vLLM) and 0 both mean off
    min_p: float = Field(default=0.0, ge=0, le=1)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)
    stop: Annotated[tuple[str, ...], PlainValidator(_stops)] | None = None
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    presence_penalty: float = Field(default=0.0, ge=-2, le=2)
    frequency_penalty: float = Field(default=0.0, ge=-2, le=2)
    repetition_penalty: float = Field(default=1.0, gt=0, le=10)
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    min_tokens: int = Field(default=0, ge=0)
    ignore_eos: bool = False
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    skip_special_tokens: bool = True
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20)  # vLLM's: the prompt's own logprobs
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict | bool | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = Field(default=None, min_length=1)
    guided_grammar: str | None = None
    # vLLM's beam search: refused when asked for (below); its two knobs only act with it, as in vLLM.
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool = False

    def sampling(self) -> SamplingParams:
        if self.use_beam_search:
            raise APIError(
                400,
                "use_beam_search: this server does not do beam search; send false or leave it out "
                "(n and best_of give several sampled candidates)",
                param="use_beam_search",
                code="unsupported_parameter",
            )
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=max(self.top_k or 0, 0),
            min_p=self.min_p,
        )

    def logprob_alternatives(self) -> int | None:
        """Alternatives per token when logprobs are asked for, else None (each endpoint spells it its way)."""
        return None

    def prompt_alternatives(self) -> int | None:
        """Alternatives per prompt token when the prompt's logprobs are needed, else None."""
        if self.prompt_logprobs is not None and self.stream:
            raise APIError(
                400,
                "prompt_logprobs: not available when stream is true (as in vLLM)",
                param="prompt_logprobs",
                code="invalid_value",
            )
        return self.prompt_logprobs

    def runs(self) -> int:
        """Generations to run: n (completions' best_of may ask for more)."""
        return self.n

    def controls(self, vocab: int) -> Controls:
        bias = []
        for key, value in (self.logit_bias or {}).items():
            if not key.lstrip("-").isdigit() or not 0 <= int(key) < vocab:
                raise APIError(
                    400,
                    f"logit_bias: {key!r} is not a token id; ids are integers in [0, {vocab})",
                    param="logit_bias",
                    code="invalid_value",
                )
            bias.append((int(key), value))
        for t in self.stop_token_ids or ():
            if t >= vocab:
                raise APIError(
                    400,
                    f"stop_token_ids: {t} is not a token id; ids are in [0, {vocab})",
                    param="stop_token_ids",
                    code="invalid_value",
                )
        return Controls(
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            logit_bias=tuple(bias),
            min_tokens=self.min_tokens,
            ignore_eos=self.ignore_eos,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            logprobs=self.logprob_alternatives(),
        )

    def grammar(self) -> tuple[str, Grammar] | None:
        """The one output constraint asked for (its field and Grammar), if any: response_format,
        structured_outputs or vLLM's guided_* fields."""
        asked: list[tuple[str, Grammar]] = []
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_object":
            asked.append(("response_format", Grammar.json_object()))
        elif fmt is not None and fmt.type == "json_schema":
            if fmt.json_schema is None:
                raise APIError(
                    400,
                    "response_format: type json_schema needs a json_schema object",
                    param="response_format.json_schema",
                    code="invalid_value",
                )
            asked.append(("response_format", Grammar.json_schema(fmt.json_schema.schema_)))
        so = self.structured_outputs or StructuredOutputs()
        for name, value, make in (
            ("json", so.json_, Grammar.json_schema),
            ("regex", so.regex, Grammar.regex),
            ("choice", so.choice, Grammar.choice),
            ("grammar", so.grammar, Grammar.lark),
        ):
            if value is not None:
                asked.append((f"structured_outputs.{name}", make(value)))
        for name, value, make in (
            ("guided_json", self.guided_json, Grammar.json_schema),
            ("guided_regex", self.guided_regex, Grammar.regex),
            ("guided_choice", self.guided_choice, Grammar.choice),
            ("guided_grammar", self.guided_grammar, Grammar.lark),
        ):
            if value is not None:
                asked.append((name, make(value)))
        if len(asked) > 1:
            raise APIError(
                400,
                f"{asked[1][0]}: only one output constraint per request, {asked[0][0]} is set too",
                param=asked[1][0],
                code="invalid_value",
            )
        return asked[0] if asked else None


class ChatBody(_Body):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    def parses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    def logprob_alternatives(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(400, "top_logprobs: needs logprobs: true", param="top_logprobs", code="invalid_value")
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionBody(_Body):
    prompt: Annotated[str | list[int], PlainValidator(_prompt)]
    max_tokens: int | None = Field(default=None, ge=0)  # 0: only the prompt's logprobs (checked in the route)
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    best_of: int | None = Field(default=None, ge=1, le=MAX_CHOICES)

    def runs(self) -> int:
        if self.best_of is None:
            return self.n
        if self.best_of < self.n:
            raise APIError(
                400, f"best_of: {self.best_of} is less than n ({self.n})", param="best_of", code="invalid_value"
            )
        if self.stream and self.best_of > self.n:
            raise APIError(
                400,
                "best_of: a stream cannot show the best choices before all have ended",
                param="best_of",
                code="invalid_value",
            )
        return self.best_of

    def logprob_alternatives(self) -> int | None:
        # best_of ranks the runs by their logprobs, asked for or not
        return 0 if self.logprobs is None and self.runs() > self.n else self.logprobs

    def prompt_alternatives(self) -> int | None:
        asked = super().prompt_alternatives()
        if not (self.echo and self.logprobs is not None):
            return asked
        return max(asked or 0, self.logprobs)  # echo shows the prompt's tokens with their logprobs


def ready_engine() -> Engine:
    eng: Engine = current_app.extensions["gemma4_engine"]
    if eng.state is not State.READY:
        retry = {"Retry-After": "5"} if eng.state is not State.FAILED else {}
        raise APIError(
            503, f"the model is not ready ({eng.state.value}: {eng.reason})", code="not_ready", headers=retry
        )
    return eng


def parse(model: type[BaseModel]) -> BaseModel:
    body = model.model_validate_json(read_body())
    log_ignored(body)
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
        raise APIError(
            400,
            f"{len(texts)} messages are more than a prompt of this model ({most} tokens at most) can hold",
            param=param,
            code="context_length_exceeded",
        )
    chars = sum(map(len, texts))
    if chars > most * chars_per_token(eng.tokenizer):
        raise APIError(
            400,
            f"the prompt has {chars} characters; a prompt of this model holds at most {most} "
            f"tokens of at most {chars_per_token(eng.tokenizer)} characters each; prompts are "
            "never truncated",
            param=param,
            code="context_length_exceeded",
        )


def tokenize(encode):
    """One request tokenizes (or templates) at a time: each thread doing it competes with the engine
    thread for the interpreter, and 4 at once made a running stream's tokens 5x slower."""
    with _TOKENIZING:
        return encode()


def check_request(eng: Engine, body: _Body) -> None:
    if body.model != eng.model_name:
        raise APIError(
            404,
            f"model {body.model!r} does not exist; this server serves {eng.model_name!r}",
            param="model",
            code="model_not_found",
        )


def compile_grammar(eng: Engine, body: _Body, forced: tuple[str, Grammar] | None = None) -> str | None:
    """The request's output constraint compiled for the engine; `forced` is one the server imposes
    (a tool call), named by the field that asked for it."""
    asked = body.grammar()
    if asked is not None and forced is not None:
        raise APIError(400, f"{asked[0]}: cannot be combined with {forced[0]}", param=asked[0], code="invalid_value")
    asked = asked or forced
    if asked is None:
        return None
    param, grammar = asked
    try:
        return eng.grammars.get().compile(grammar)
    except GrammarError as exc:
        raise APIError(
            400, f"{param}: the grammar engine refused it: {exc}", param=param, code="invalid_value"
        ) from None


def submit(
    eng: Engine,
    body: _Body,
    prompt: list[int],
    max_tokens: int | None,
    param: str,
    default: int | None = None,
    skip_special_tokens: bool = True,
    forced: tuple[str, Grammar] | None = None,
) -> Job:
    try:
        budget = token_budget(eng.geometry, len(prompt), max_tokens, default)
    except DoesNotFit as exc:
        raise APIError(400, str(exc), param=param, code="context_length_exceeded") from None
    job = Job(
        prompt,
        budget,
        body.sampling(),
        body.stop or (),
        body.seed,
        controls=body.controls(eng.geometry.vocab),
        grammar=compile_grammar(eng, body, forced),
        skip_special_tokens=skip_special_tokens,
        prompt_logprobs=body.prompt_alternatives(),
    )
    try:
        return eng.submit(job, body.runs())
    except QueueFull as exc:
        raise APIError(503, str(exc), code="queue_full", headers={"Retry-After": RETRY_AFTER_S}) from None
    except NotReady as exc:  # it began to drain or failed since ready_engine()
        raise APIError(503, str(exc), code="not_ready", headers={"Retry-After": RETRY_AFTER_S}) from None


# -- models ------------------------------------------------------------------------------------------
def model_card(eng: Engine) -> dict:
    """OpenAI's model object plus what clients read for the context size (vLLM's max_model_len)."""
    created = int(datetime.datetime.fromisoformat(eng.model.meta.created).timestamp())
    return {
        "id": eng.model_name,
        "object": "model",
        "created": created,
        "owned_by": "gemma4-inf2",
        "root": eng.model.meta.name,
        "parent": None,
        "max_model_len": eng.geometry.kv_max,
        "context_length": eng.geometry.kv_max,
    }


@bp.get("/models")
def list_models():
    return jsonify({"object": "list", "data": [model_card(ready_engine())]})


@bp.get("/models/<path:model_id>")
def get_model(model_id: str):
    eng = ready_engine()
    if model_id != eng.model_name:
        raise APIError(
            404,
            f"model {model_id!r} does not exist; this server serves {eng.model_name!r}",
            param="model",
            code="model_not_found",
        )
    return jsonify(model_card(eng))


# -- completions -------------------------------------------------------------------------------------
@bp.post("/chat/completions")
def chat_completions():
    body: ChatBody = parse(ChatBody)
    eng = ready_engine()
    check_request(eng, body)
    check_size(eng, [m.content or "" for m in body.messages], "messages")
    try:
        text = tokenize(
            lambda: render(eng.tokenizer, body.messages, body.tools, body.tool_choice, body.chat_template_kwargs)
        )
    except ChatTemplateError as exc:
        raise APIError(400, f"{exc.param}: {exc}", param=exc.param, code="invalid_value") from None
    except TemplateError as exc:
        raise APIError(400, f"messages: the model's chat template refused them: {exc}", param="messages") from None
    prompt = tokenize(lambda: eng.tokenizer(text, add_special_tokens=False).input_ids)  # the template writes <bos>
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    # The reply's parser needs the special tokens as boundaries; it drops them from what it passes on.
    job = submit(
        eng,
        body,
        list(prompt),
        max_tokens,
        "messages",
        skip_special_tokens=False,
        forced=forced(eng.tokenizer, body.tools, body.tool_choice, body.parallel_tool_calls, text),
    )
    parser = functools.partial(ReplyParser, eng.tokenizer, text, body.parses_tools(), body.skip_special_tokens)
    return respond(
        job,
        body,
        Shape(
            eng.model_name,
            token_bytes(eng),
            parser,
            logprobs=body.logprobs,
            named_tool=isinstance(body.tool_choice, ToolChoiceFunction),
            prompt_logprobs=body.prompt_logprobs,
        ),
    )


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
    if body.max_tokens == 0 and body.prompt_alternatives() is None:
        raise APIError(
            400,
            "max_tokens: 0 generates nothing, so it only scores the prompt: send it with echo and "
            "logprobs, or with prompt_logprobs; else at least 1",
            param="max_tokens",
            code="invalid_value",
        )
    job = submit(
        eng,
        body,
        list(prompt),
        body.max_tokens,
        "prompt",
        COMPLETIONS_DEFAULT_MAX_TOKENS,
        skip_special_tokens=body.skip_special_tokens,
    )
    echo = "" if not body.echo else body.prompt if isinstance(body.prompt, str) else eng.tokenizer.decode(prompt)
    return respond(
        job,
        body,
        Shape(
            eng.model_name,
            token_bytes(eng),
            logprobs=body.logprobs is not None,
            echo=echo,
            echo_logprobs=body.logprobs if body.echo else None,
            prompt_logprobs=body.prompt_logprobs,
        ),
    )


def token_bytes(eng: Engine):
    return lambda tid: eng.grammars.get().tokenizer.decode_bytes([tid])


# -- responses ---------------------------------------------------------------------------------------
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


def respond(job: Job, body: _Body, shape: Shape):
    if body.stream:
        opts = body.stream_options or StreamOptions()
        return Response(
            stream(job, shape, body.n, opts.include_usage, opts.continuous_usage_stats),
            mimetype="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return jsonify(whole(job, shape, body.n, body.runs(), abandoned=client_gone(request.environ)))


# -- vLLM's tokenizer routes ---------------------------------------------------------------------------
class TokenizeBody(_Lenient):
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = Field(default=None, min_length=1)
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeBody(_Lenient):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]


def _check_model(eng: Engine, model: str | None) -> None:
    if model is not None and model != eng.model_name:
        raise APIError(
            404,
            f"model {model!r} does not exist; this server serves {eng.model_name!r}",
            param="model",
            code="model_not_found",
        )


@vllm_bp.post("/tokenize")
def tokenize_text():
    body: TokenizeBody = parse(TokenizeBody)
    eng = ready_engine()
    _check_model(eng, body.model)
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give exactly one of prompt and messages", param="prompt", code="invalid_value")
    if body.messages is not None:
        try:
            dicts = [m.template_dict(f"messages.{i}") for i, m in enumerate(body.messages)]
            text = tokenize(
                lambda: eng.tokenizer.apply_chat_template(
                    dicts, add_generation_prompt=body.add_generation_prompt, tokenize=False
                )
            )
        except ChatTemplateError as exc:
            raise APIError(400, f"{exc.param}: {exc}", param=exc.param, code="invalid_value") from None
        except TemplateError as exc:
            raise APIError(400, f"messages: the model's chat template refused them: {exc}", param="messages") from None
        ids = tokenize(lambda: eng.tokenizer(text, add_special_tokens=False).input_ids)  # the template writes <bos>
    else:
        ids = tokenize(lambda: eng.tokenizer(body.prompt, add_special_tokens=body.add_special_tokens).input_ids)
    out: dict[str, Any] = {
        "count": len(ids),
        "max_model_len": eng.geometry.kv_max,
        "tokens": list(ids),
        "token_strs": eng.tokenizer.convert_ids_to_tokens(list(ids)) if body.return_token_strs else None,
    }
    return jsonify(out)


@vllm_bp.post("/detokenize")
def detokenize_ids():
    body: DetokenizeBody = parse(DetokenizeBody)
    eng = ready_engine()
    _check_model(eng, body.model)
    vocab = eng.geometry.vocab
    if not all(t < vocab for t in body.tokens):
        raise APIError(400, f"tokens: token ids must be in [0, {vocab})", param="tokens", code="invalid_value")
    return jsonify({"prompt": eng.tokenizer.decode(body.tokens)})
