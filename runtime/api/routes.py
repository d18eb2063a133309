"""The OpenAI API: /v1/models, /v1/completions, /v1/chat/completions, /v1/responses, streamed (SSE)
or not, and vLLM's /tokenize and /detokenize. Handlers only: the request bodies are the protocol modules'
(protocol.py, chat_protocol.py, completions_protocol.py, responses_protocol.py), what every generating
route does with one is runtime.api.handling's."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from flask import Blueprint, jsonify, request

from runtime.api import responses
from runtime.api.bodies import ResponseSpec
from runtime.api.caps import check_costs, check_messages
from runtime.api.chat import template_messages, tool_names
from runtime.api.chat_protocol import ChatCompletionRequest, ToolChoiceFunction
from runtime.api.completions_protocol import CompletionRequest, DetokenizeRequest, TokenizeRequest
from runtime.api.handling import (
    check_model,
    client_gone,
    event_stream,
    parse,
    ready_engine,
    respond,
    start_chat,
    submit,
    token_bytes,
)
from runtime.api.media_request import expand_media, prepare_media
from runtime.api.openai_errors import APIError
from runtime.api.rendering import check_size, render_prompt, template_errors
from runtime.api.responses_input import chat_request
from runtime.api.responses_protocol import ResponsesRequest
from runtime.api.state import server_state
from runtime.api.templating import template_call
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
    run = start_chat(eng, body)
    spec = ResponseSpec(
        eng.model_name,
        token_bytes(eng),
        run.parser,
        logprobs=body.logprobs,
        named_tool=isinstance(body.tool_choice, ToolChoiceFunction),
        prompt_logprobs=body.prompt_logprobs,
    )
    return respond([run.job], body, [spec])


@bp.post("/responses")
def create_response():
    """OpenAI's Responses API, stateless, served by the chat pipeline (responses_input.py, responses.py)."""
    body = parse(ResponsesRequest)
    body.stateless()
    eng = ready_engine()
    run = start_chat(eng, ChatCompletionRequest.model_validate(chat_request(body)), (body.media_parts(), "input"))
    meta = responses.Meta(body, eng.model_name)
    if body.stream:
        return event_stream(responses.stream(run.job, meta, run.parser()))
    return jsonify(responses.whole(run.job, meta, run.parser(), abandoned=client_gone(request.environ)))


@bp.post("/completions")
def completions():
    body = parse(CompletionRequest)
    eng = ready_engine()
    check_model(eng, body.model)
    check_costs(body, server_state().limits)
    if body.suffix is not None:
        raise APIError(
            400,
            "suffix: fill-in-the-middle needs FIM tokens, and Gemma-4's vocabulary has none; send the text "
            "before the gap as the prompt, without suffix",
            param="suffix",
            code="unsupported_parameter",
        )
    if body.max_tokens == 0 and body.prompt_alternatives() is None:
        raise APIError(
            400,
            "max_tokens: 0 generates nothing, so it only scores the prompt: send it with echo and "
            "logprobs, or with prompt_logprobs; else at least 1",
            param="max_tokens",
            code="invalid_value",
        )
    batch = len(body.prompt) > 1
    prompts = [prompt_ids(eng, p, f"prompt.{i}" if batch else "prompt") for i, p in enumerate(body.prompt)]
    if len(body.prompt) > eng.settings.queue_max:
        raise APIError(
            400,
            f"prompt: {len(body.prompt)} prompts are more than the request queue holds "
            f"({eng.settings.queue_max}, GEMMA4_QUEUE_MAX); send them in smaller batches",
            param="prompt",
            code="invalid_value",
        )
    spec = ResponseSpec(
        eng.model_name,
        token_bytes(eng),
        logprobs=body.logprobs is not None,
        echo_logprobs=body.logprobs if body.echo else None,
        prompt_logprobs=body.prompt_logprobs,
    )
    specs, jobs = [], []
    try:  # prompt i's choices are jobs[i]'s; one that cannot start withdraws the ones before it
        for text, ids in zip(body.prompt, prompts):
            echo = "" if not body.echo else text if isinstance(text, str) else eng.tokenizer.decode(ids)
            specs.append(dataclasses.replace(spec, echo=echo))
            jobs.append(
                submit(
                    eng,
                    body,
                    ids,
                    body.max_tokens,
                    "prompt",
                    COMPLETIONS_DEFAULT_MAX_TOKENS,
                    skip_special_tokens=body.skip_special_tokens,
                )
            )
    except APIError:
        for job in jobs:
            job.cancel()
        raise
    return respond(jobs, body, specs)


def prompt_ids(eng: Engine, prompt: str | list[int], param: str) -> list[int]:
    """One prompt of /v1/completions as token ids: a string tokenized, ids checked against the vocabulary."""
    if isinstance(prompt, str):
        check_size(eng, [prompt], param)
        with server_state().tokenizer_lock:
            return list(eng.tokenizer(prompt).input_ids)
    vocab = eng.geometry.vocab
    if not all(0 <= t < vocab for t in prompt):
        raise APIError(400, f"{param}: token ids must be in [0, {vocab})", param=param, code="invalid_value")
    return list(prompt)


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
        # images and audio count their soft tokens, as the chat route would prefill them
        items = prepare_media(eng, [p for i, m in enumerate(body.messages) for p in m.media(f"messages.{i}")])
        with template_errors():
            dicts = template_messages(body.messages, tool_names(None, body.messages))  # as chat converts them
        call = template_call(eng.tokenizer, dicts, None, body.add_generation_prompt, {})
        text = render_prompt(eng, call, fit=False)  # a count may exceed the context: max_model_len is beside it
        with state.tokenizer_lock:
            ids = eng.tokenizer(text, add_special_tokens=False).input_ids  # the template writes <bos>
        ids, _ = expand_media(eng, ids, items)
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
