"""The OpenAI API: /v1/models, /v1/completions, /v1/chat/completions, streamed (SSE) or not, and
vLLM's /tokenize and /detokenize. Handlers only: the request bodies are runtime.api.protocol's, what
every generating route does with one is runtime.api.handling's."""

from __future__ import annotations

import datetime
import functools
from typing import Any

from flask import Blueprint, jsonify

from runtime.api.bodies import ResponseSpec
from runtime.api.caps import check_costs, check_messages
from runtime.api.chat import ToolChoiceFunction, render, template_kwargs, template_messages, tool_names
from runtime.api.errors import APIError
from runtime.api.handling import (
    check_model,
    check_size,
    parse,
    ready_engine,
    render_prompt,
    respond,
    submit,
    template_errors,
    token_bytes,
)
from runtime.api.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from runtime.api.reply_parser import ReplyParser
from runtime.api.state import server_state
from runtime.api.tool_grammar import forced
from runtime.generate.engine import Engine

bp = Blueprint("openai", __name__, url_prefix="/v1")
vllm_bp = Blueprint("vllm", __name__)  # vLLM's routes outside /v1

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat defaults to the room left


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
    check_model(eng, model_id)
    return jsonify(model_card(eng))


# -- completions -------------------------------------------------------------------------------------
@bp.post("/chat/completions")
def chat_completions():
    body = parse(ChatCompletionRequest)
    eng = ready_engine()
    check_model(eng, body.model)
    state = server_state()
    check_costs(body, state.limits)
    check_size(eng, [m.content or "" for m in body.messages], "messages")
    names = tool_names(body.tools, body.messages)  # aliases for names Gemma's call syntax cannot carry
    text = render_prompt(
        eng,
        lambda: render(
            eng.tokenizer, body.messages, body.tools, body.tool_choice, body.chat_template_kwargs, names, state.limits
        ),
    )
    with state.tokenizer_lock:
        prompt = eng.tokenizer(text, add_special_tokens=False).input_ids  # the template writes <bos>
    with template_errors():  # a tool schema the grammar cannot follow, or one past a cap, is a 400 too
        thinking = template_kwargs(body.chat_template_kwargs, state.limits).get("enable_thinking") is True
        limits = eng.settings.grammar_limits
        grammar = forced(eng.tokenizer, body.tools, body.tool_choice, body.parallel_tool_calls, limits, names, thinking)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    # The reply's parser needs the special tokens as boundaries; it drops them from what it passes on.
    job = submit(
        eng,
        body,
        list(prompt),
        max_tokens,
        "messages",
        skip_special_tokens=False,
        imposed=grammar,
    )
    parser = functools.partial(
        ReplyParser, eng.tokenizer, text, body.parses_tools(), body.skip_special_tokens, names=names
    )
    return respond(
        job,
        body,
        ResponseSpec(
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
    body = parse(CompletionRequest)
    eng = ready_engine()
    check_model(eng, body.model)
    check_costs(body, server_state().limits)
    if isinstance(body.prompt, str):
        check_size(eng, [body.prompt], "prompt")
        with server_state().tokenizer_lock:
            prompt = eng.tokenizer(body.prompt).input_ids
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
        ResponseSpec(
            eng.model_name,
            token_bytes(eng),
            logprobs=body.logprobs is not None,
            echo=echo,
            echo_logprobs=body.logprobs if body.echo else None,
            prompt_logprobs=body.prompt_logprobs,
        ),
    )


# -- vLLM's tokenizer routes ---------------------------------------------------------------------------
@vllm_bp.post("/tokenize")
def tokenize_text():
    body = parse(TokenizeRequest)
    eng = ready_engine()
    check_model(eng, body.model)
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give exactly one of prompt and messages", param="prompt", code="invalid_value")
    state = server_state()
    if body.messages is not None:
        check_messages(body.messages, state.limits)
        with template_errors():
            dicts = template_messages(body.messages, tool_names(None, body.messages))  # as chat converts them
        text = render_prompt(
            eng,
            lambda: eng.tokenizer.apply_chat_template(
                dicts, add_generation_prompt=body.add_generation_prompt, tokenize=False
            ),
            fit=False,  # a count may exceed the context: the answer says max_model_len beside it
        )
        with state.tokenizer_lock:
            ids = eng.tokenizer(text, add_special_tokens=False).input_ids  # the template writes <bos>
    else:
        with state.tokenizer_lock:
            ids = eng.tokenizer(body.prompt, add_special_tokens=body.add_special_tokens).input_ids
    out: dict[str, Any] = {
        "count": len(ids),
        "max_model_len": eng.geometry.kv_max,
        "tokens": list(ids),
        "token_strs": eng.tokenizer.convert_ids_to_tokens(list(ids)) if body.return_token_strs else None,
    }
    return jsonify(out)


@vllm_bp.post("/detokenize")
def detokenize_ids():
    body = parse(DetokenizeRequest)
    eng = ready_engine()
    check_model(eng, body.model)
    vocab = eng.geometry.vocab
    if not all(t < vocab for t in body.tokens):
        raise APIError(400, f"tokens: token ids must be in [0, {vocab})", param="tokens", code="invalid_value")
    return jsonify({"prompt": eng.tokenizer.decode(body.tokens)})
