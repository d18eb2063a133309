"""The OpenAI routes through the app factory and Flask's test client: completions and chat, streamed
and whole, sampling and structured-output fields, bad input, the queue and client departures."""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import jsonschema
import pytest

from support.http import CHAT, COMPLETIONS, HI, MODEL, assert_error, client, engine, settings, sse_events  # noqa: F401


@pytest.mark.parametrize(
    "path,body",
    [
        (CHAT, {"model": MODEL, "messages": HI, "max_tokens": 10, "temperature": 0}),
        (COMPLETIONS, {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 10, "temperature": 0}),
    ],
)
def test_streamed_text_equals_the_whole_response(client, path, body):
    whole = client.post(path, json=body).get_json()
    choice = whole["choices"][0]
    text = choice["message"]["content"] if path == CHAT else choice["text"]
    assert choice["finish_reason"] == "length" and whole["usage"]["completion_tokens"] == 10
    assert whole["usage"]["total_tokens"] == whole["usage"]["prompt_tokens"] + 10
    resp = client.post(path, json=body | {"stream": True, "stream_options": {"include_usage": True}})
    assert resp.mimetype == "text/event-stream"
    events = sse_events(resp.get_data())
    usage = events.pop()
    assert usage["choices"] == [] and usage["usage"] == whole["usage"]
    if path == CHAT:
        assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        pieces = [e["choices"][0]["delta"].get("content", "") for e in events]
        assert {e["object"] for e in events} == {"chat.completion.chunk"}
    else:
        pieces = [e["choices"][0]["text"] for e in events]
    assert "".join(pieces) == text
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert len({e["id"] for e in events}) == 1


def test_completions_accept_token_ids_and_default_to_16_tokens(client, engine):
    ids = engine.tokenizer("hello world").input_ids
    by_ids = client.post(COMPLETIONS, json={"model": MODEL, "prompt": ids, "temperature": 0}).get_json()
    by_text = client.post(COMPLETIONS, json={"model": MODEL, "prompt": "hello world", "temperature": 0}).get_json()
    assert by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]
    assert by_ids["usage"]["completion_tokens"] == 16
    for batch_of_one in ([ids], ["hello world"]):  # as lm-evaluation-harness sends a prompt
        one = client.post(COMPLETIONS, json={"model": MODEL, "prompt": batch_of_one, "temperature": 0}).get_json()
        assert one["choices"][0]["text"] == by_text["choices"][0]["text"]


def test_stop_strings_over_the_api(client):
    body = {"model": MODEL, "messages": HI, "max_tokens": 12, "temperature": 0}
    text = client.post(CHAT, json=body).get_json()["choices"][0]["message"]["content"]
    stop = text[4:7]
    for stops in (stop, [stop, "never-appears"]):
        out = client.post(CHAT, json=body | {"stop": stops}).get_json()["choices"][0]
        assert out["finish_reason"] == "stop" and out["message"]["content"] == text[: text.find(stop)]


TOO_LONG = "hello world " * 40  # > 64 tokens, the context of tiny-e2b


@pytest.mark.parametrize(
    "path,body,status,param,code",
    [
        (CHAT, b"{not json", 400, None, "invalid_json"),
        (CHAT, b"[1, 2]", 400, None, "invalid_type"),
        (CHAT, {"model": MODEL}, 400, "messages", None),
        (CHAT, {"model": MODEL, "messages": []}, 400, "messages", None),
        (CHAT, {"model": MODEL, "messages": "hi"}, 400, "messages", None),
        (CHAT, {"model": MODEL, "messages": [{"role": "user", "content": 5}]}, 400, "messages.0.content", None),
        (CHAT, {"model": MODEL, "messages": [{"role": "function", "content": "x"}]}, 400, "messages.0.role", None),
        (
            CHAT,
            {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            400,
            "messages.0.content",
            None,
        ),
        (CHAT, {"model": "gpt-4", "messages": HI}, 404, "model", "model_not_found"),
        (CHAT, {"model": MODEL, "messages": HI, "max_tokens": "5"}, 400, "max_tokens", None),
        (CHAT, {"model": MODEL, "messages": HI, "max_tokens": 0}, 400, "max_tokens", None),
        (CHAT, {"model": MODEL, "messages": HI, "max_tokens": 2.5}, 400, "max_tokens", None),
        (CHAT, {"model": MODEL, "messages": HI, "temperature": "hot"}, 400, "temperature", None),
        (CHAT, {"model": MODEL, "messages": HI, "temperature": 3}, 400, "temperature", None),
        (CHAT, {"model": MODEL, "messages": HI, "top_p": 0}, 400, "top_p", None),
        (CHAT, {"model": MODEL, "messages": HI, "top_k": -2}, 400, "top_k", None),
        (CHAT, {"model": MODEL, "messages": HI, "stream": "yes"}, 400, "stream", None),
        (CHAT, {"model": MODEL, "messages": HI, "stop": 5}, 400, "stop", None),
        (CHAT, {"model": MODEL, "messages": HI, "stop": [""]}, 400, "stop", None),
        (CHAT, {"model": MODEL, "messages": HI, "n": 129}, 400, "n", None),
        (CHAT, {"model": MODEL, "messages": HI, "n": 0}, 400, "n", None),
        (CHAT, {"model": MODEL, "messages": HI, "logprobs": "yes"}, 400, "logprobs", None),
        (CHAT, {"model": MODEL, "messages": HI, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs", None),
        (CHAT, {"model": MODEL, "messages": HI, "top_logprobs": 2}, 400, "top_logprobs", None),
        (CHAT, {"model": MODEL, "messages": HI, "presence_penalty": 3}, 400, "presence_penalty", None),
        (CHAT, {"model": MODEL, "messages": HI, "repetition_penalty": 0}, 400, "repetition_penalty", None),
        (CHAT, {"model": MODEL, "messages": HI, "logit_bias": {"abc": 1}}, 400, "logit_bias", None),
        (CHAT, {"model": MODEL, "messages": HI, "logit_bias": {"5": 101}}, 400, "logit_bias.5", None),
        (CHAT, {"model": MODEL, "messages": HI, "logit_bias": {"99999": 1}}, 400, "logit_bias", None),
        (CHAT, {"model": MODEL, "messages": HI, "stop_token_ids": [99999]}, 400, "stop_token_ids", None),
        (CHAT, {"model": MODEL, "messages": HI, "min_tokens": -1}, 400, "min_tokens", None),
        (CHAT, {"model": MODEL, "messages": HI, "ignore_eos": "no"}, 400, "ignore_eos", None),
        (
            CHAT,
            {"model": MODEL, "messages": HI, "stream_options": {"include_usage": 1}},
            400,
            "stream_options.include_usage",
            None,
        ),
        (CHAT, {"model": MODEL, "messages": HI, "response_format": {"type": "xml"}}, 400, "response_format.type", None),
        (
            CHAT,
            {"model": MODEL, "messages": HI, "response_format": {"type": "json_schema"}},
            400,
            "response_format.json_schema",
            None,
        ),
        (
            CHAT,
            {
                "model": MODEL,
                "messages": HI,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wat"}}},
            },
            400,
            "response_format",
            None,
        ),
        (
            CHAT,
            {"model": MODEL, "messages": HI, "guided_regex": "(", "guided_choice": ["a"]},
            400,
            "guided_choice",
            None,
        ),
        (CHAT, {"model": MODEL, "messages": HI, "guided_regex": "("}, 400, "guided_regex", None),
        (CHAT, {"model": MODEL, "messages": HI, "max_tokens": 100}, 400, "messages", "context_length_exceeded"),
        (
            CHAT,
            {"model": MODEL, "messages": [{"role": "user", "content": TOO_LONG}]},
            400,
            "messages",
            "context_length_exceeded",
        ),
        (COMPLETIONS, {"model": MODEL, "prompt": TOO_LONG}, 400, "prompt", "context_length_exceeded"),
        (COMPLETIONS, {"model": MODEL, "prompt": []}, 400, "prompt", None),
        (COMPLETIONS, {"model": MODEL, "prompt": [1, 99999]}, 400, "prompt", None),
        (COMPLETIONS, {"model": MODEL, "prompt": ["a", 5]}, 400, "prompt", None),
        (COMPLETIONS, {"model": MODEL, "prompt": "x", "suffix": "y"}, 400, "suffix", "unsupported_parameter"),
        (COMPLETIONS, {"model": MODEL, "prompt": "x", "logprobs": 6}, 400, "logprobs", None),
        (CHAT, {"model": MODEL, "messages": HI, "min_p": 1.5}, 400, "min_p", None),
        (CHAT, {"model": MODEL, "messages": HI, "min_p": -0.1}, 400, "min_p", None),
        (
            CHAT,
            {"model": MODEL, "messages": HI, "use_beam_search": True},
            400,
            "use_beam_search",
            "unsupported_parameter",
        ),
        (
            COMPLETIONS,
            {"model": MODEL, "prompt": "x", "use_beam_search": True, "length_penalty": 0.5},
            400,
            "use_beam_search",
            "unsupported_parameter",
        ),
        (CHAT, {"model": MODEL, "messages": HI, "length_penalty": "long"}, 400, "length_penalty", None),
        (COMPLETIONS, {"model": MODEL, "prompt": [[1, 2], []]}, 400, "prompt", None),
        (COMPLETIONS, {"model": MODEL, "prompt": [[1, 2], [1, 99999]], "n": 1}, 400, "prompt.1", None),
        (COMPLETIONS, {"model": MODEL, "prompt": ["a", "b"]}, 400, "prompt", None),  # more than the queue of 1
        (COMPLETIONS, {"model": MODEL, "prompt": "x", "prompt_logprobs": -1}, 400, "prompt_logprobs", None),
        (CHAT, {"model": MODEL, "messages": HI, "prompt_logprobs": 21}, 400, "prompt_logprobs", None),
    ],
)
def test_bad_input_gets_a_4xx_json_error_and_the_server_stays_ready(client, path, body, status, param, code):
    resp = client.post(path, data=body) if isinstance(body, bytes) else client.post(path, json=body)
    assert_error(resp, status, param, code)
    assert client.get("/ready").status_code == 200


@pytest.mark.parametrize(
    "path, body, param",
    [
        (COMPLETIONS, {"model": MODEL, "prompt": "x" * 500_000}, "prompt"),
        (CHAT, {"model": MODEL, "messages": [{"role": "user", "content": "y" * 250_000}] * 2}, "messages"),
        (CHAT, {"model": MODEL, "messages": [{"role": "user", "content": "a"}] * 70}, "messages"),  # > kv_max - 1
    ],
)
def test_what_cannot_fit_is_refused_before_tokenizing(client, monkeypatch, path, body, param):
    """A 1 MB prompt took ~1 s of CPU to template and tokenize before its length was checked."""
    from runtime.api.state import server_state

    class NoTokenizing:  # tokenizing and templating happen under this lock
        def __enter__(self):
            pytest.fail("the prompt was tokenized")

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(server_state(client.application), "tokenizer_lock", NoTokenizing())
    assert_error(client.post(path, json=body), 400, param, "context_length_exceeded")


def test_the_character_bound_never_refuses_a_prompt_that_fits(client, engine):
    from runtime.api.rendering import chars_per_token

    longest = max(engine.tokenizer.get_vocab(), key=len)
    assert len(longest) == chars_per_token(engine.tokenizer)
    text = engine.tokenizer.convert_tokens_to_string([longest]) * 8  # few tokens, many characters
    resp = client.post(COMPLETIONS, json={"model": MODEL, "prompt": text, "max_tokens": 2})
    assert resp.status_code == 200, resp.get_data(as_text=True)


def test_too_long_prompt_and_max_tokens_errors_name_the_numbers(client):
    err = assert_error(client.post(COMPLETIONS, json={"model": MODEL, "prompt": TOO_LONG}), 400)
    assert "context of this model is 64 tokens" in err["message"] and "at most 63" in err["message"]
    err = assert_error(client.post(COMPLETIONS, json={"model": MODEL, "prompt": "hi", "max_tokens": 70}), 400)
    assert "max_tokens (70)" in err["message"] and "64 tokens" in err["message"]


def test_full_queue_answers_503_with_retry_after(client, engine, monkeypatch):
    # The running job's decode steps wait at a gate: a tiny model would otherwise finish its 40 tokens,
    # and free the queue, before the third request arrives.
    gate, decode = threading.Event(), engine.model.runner.decode
    monkeypatch.setattr(engine.model.runner, "decode", lambda tokens: gate.wait(30) and decode(tokens))
    # Chat streams: their first chunk (the role) comes at once, so the test client returns at once.
    body = {"model": MODEL, "messages": HI, "max_tokens": 40, "stream": True}
    running = client.post(CHAT, json=body, buffered=False)  # in the slot
    waiting = client.post(CHAT, json=body, buffered=False)  # in the queue (size 1)
    refused = client.post(CHAT, json=body)
    gate.set()
    err = assert_error(refused, 503, code="queue_full")
    assert refused.headers["Retry-After"] == "1" and "retry" in err["message"]
    for resp in (running, waiting):
        resp.close()  # the client leaves: both jobs are cancelled
    deadline = time.monotonic() + 30
    while engine.busy_slots or engine.queue_depth:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert client.get("/ready").status_code == 200


@pytest.mark.parametrize("peer_closes", [True, False], ids=["client-left", "client-waits"])
def test_a_client_that_leaves_a_whole_answer_frees_its_slot(client, engine, monkeypatch, peer_closes):
    """Non-streaming: nothing is written until the end, so the client's socket is watched meanwhile."""
    gate, decode = threading.Event(), engine.model.runner.decode
    monkeypatch.setattr(engine.model.runner, "decode", lambda tokens: gate.wait(30) and decode(tokens))
    ours, peer = socket.socketpair()
    if peer_closes:
        peer.close()
    out = {}
    body = {"model": MODEL, "messages": HI, "max_tokens": 40, "temperature": 0}
    worker = threading.Thread(
        target=lambda: out.update(resp=client.post(CHAT, json=body, environ_base={"gunicorn.socket": ours}))
    )
    worker.start()
    time.sleep(0.5)  # the job is in its slot, at the gate, and the client's socket was looked at
    gate.set()
    worker.join(60)
    if peer_closes:
        assert_error(out["resp"], 499, code="client_closed")
    else:
        assert out["resp"].status_code == 200 and out["resp"].get_json()["usage"]["completion_tokens"] == 40
        peer.close()
    ours.close()
    assert engine.busy_slots == 0 and client.get("/ready").status_code == 200


def test_unknown_fields_are_ignored_and_logged_once_neutral_values_accepted(client, caplog):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi", "x_note": 1}],
        "max_tokens": 3,
        "temperature": 0,
        "x_vendor": {"a": 1},
        "stream_options": {"include_usage": False, "x_opt": 1},
        # what clients send with neutral values
        "presence_penalty": 0,
        "frequency_penalty": 0,
        "logprobs": False,
        "response_format": {"type": "text"},
        "n": 1,
        "user": "u-1",
        "metadata": {"k": "v"},
        "max_completion_tokens": 3,
        "top_k": -1,
        "repetition_penalty": 1.0,
        "skip_special_tokens": True,
        "logit_bias": {},
        "stop_token_ids": [],
        "min_p": 0,
        "use_beam_search": False,
        "length_penalty": 1.0,
        "early_stopping": False,
    }
    plain = client.post(
        CHAT, json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
    ).get_json()
    with caplog.at_level("WARNING", logger="gemma4.api"):
        first = client.post(CHAT, json=body)
        second = client.post(CHAT, json=body)
    assert first.status_code == second.status_code == 200
    assert first.get_json()["choices"][0]["message"] == plain["choices"][0]["message"]
    logged = [r.getMessage() for r in caplog.records if "is ignored" in r.getMessage()]
    assert sorted(m.split("'")[1] for m in logged) == ["messages[].x_note", "stream_options.x_opt", "x_vendor"]


SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "rank": {"type": "integer", "minimum": 1, "maximum": 9},
        "kind": {"enum": ["town", "capital"]},
    },
    "required": ["city", "rank", "kind"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    "extra,check",
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "place", "schema": SCHEMA, "strict": True},
                }
            },
            lambda text: jsonschema.validate(json.loads(text), SCHEMA),
        ),
        ({"structured_outputs": {"choice": ["Paris", "Rome"]}}, lambda text: text in ("Paris", "Rome")),
        ({"guided_regex": "[0-9]{2}-[a-z]{3}"}, lambda text: re.fullmatch("[0-9]{2}-[a-z]{3}", text)),
        ({"guided_json": SCHEMA}, lambda text: jsonschema.validate(json.loads(text), SCHEMA)),
    ],
)
def test_structured_outputs_hold_on_the_random_model(client, extra, check):
    for stream in (False, True):
        for seed in range(2):
            body = {
                "model": MODEL,
                "messages": HI,
                "max_tokens": 40,
                "temperature": 1.0,
                "seed": seed,
                "stream": stream,
            } | extra
            resp = client.post(CHAT, json=body)
            if stream:
                events = sse_events(resp.get_data())
                text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
                finish = events[-1]["choices"][0]["finish_reason"]
            else:
                choice = resp.get_json()["choices"][0]
                text, finish = choice["message"]["content"], choice["finish_reason"]
            assert finish == "stop", text
            assert check(text) is not False, text


def test_models_tokenize_and_detokenize(client, engine):
    card = client.get("/v1/models").get_json()["data"][0]
    assert card["max_model_len"] == card["context_length"] == engine.geometry.kv_max
    tok = client.post("/tokenize", json={"model": MODEL, "prompt": "hello world"}).get_json()
    assert tok["tokens"] == engine.tokenizer("hello world").input_ids and tok["count"] == len(tok["tokens"])
    assert tok["max_model_len"] == engine.geometry.kv_max
    chat = client.post("/tokenize", json={"messages": HI}).get_json()
    assert chat["tokens"] == list(
        engine.tokenizer.apply_chat_template(HI, add_generation_prompt=True, tokenize=True, return_dict=False)
    )
    back = client.post("/detokenize", json={"model": MODEL, "tokens": tok["tokens"][1:]}).get_json()
    assert back == {"prompt": "hello world"}
    assert_error(client.post("/tokenize", json={"prompt": "a", "messages": HI}), 400, "prompt")
    assert_error(client.post("/detokenize", json={"tokens": [10**7]}), 400, "tokens")
    assert_error(client.post("/detokenize", json={"model": "gpt-4", "tokens": [1]}), 404, "model")


def test_n_choices_take_turns_on_a_single_slot(client):
    body = {"model": MODEL, "messages": HI, "max_tokens": 5, "temperature": 0, "n": 2}
    reply = client.post(CHAT, json=body).get_json()
    assert [c["message"]["content"] for c in reply["choices"]] == [reply["choices"][0]["message"]["content"]] * 2
    assert reply["usage"]["completion_tokens"] == 10


def test_a_forced_grammar_compiles_and_refuses_a_second_constraint(engine):
    from runtime.api.chat_protocol import ChatCompletionRequest
    from runtime.api.handling import compile_grammar
    from runtime.api.openai_errors import APIError
    from runtime.generate.grammar import Grammar, GrammarMatcher

    forced = ("tool_choice", Grammar.lark('start: "call:" /[a-z]+/'))
    plain = ChatCompletionRequest.model_validate({"model": MODEL, "messages": HI})
    assert isinstance(compile_grammar(engine, plain, forced), GrammarMatcher)
    with pytest.raises(APIError, match="tool_choice") as info:
        compile_grammar(engine, plain, ("tool_choice", Grammar.lark("start: nope")))
    assert info.value.param == "tool_choice"
    both = ChatCompletionRequest.model_validate({"model": MODEL, "messages": HI, "guided_regex": "a+"})
    with pytest.raises(APIError, match="guided_regex: cannot be combined with tool_choice"):
        compile_grammar(engine, both, forced)


def test_the_model_has_no_fill_in_the_middle_tokens(engine):
    """Why `suffix` is refused: Gemma-4's special tokens (which the test tokenizer carries) include no
    FIM tokens (CodeGemma's <|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>) to build such a prompt from."""
    specials = {t.content for t in engine.tokenizer.added_tokens_decoder.values()}
    assert "<|tool_call>" in specials and not any("fim" in t.lower() for t in specials)


def test_a_request_turns_speculation_off_with_disable_spec_decode(client, engine, monkeypatch):
    seen, submit = [], engine.submit
    monkeypatch.setattr(engine, "submit", lambda job, choices=1: (seen.append(job.speculate), submit(job, choices))[1])
    for body in ({"disable_spec_decode": True}, {"disable_spec_decode": False}, {}):
        resp = client.post(CHAT, json={"model": MODEL, "messages": HI, "max_tokens": 2} | body)
        assert resp.status_code == 200, resp.get_data(as_text=True)
    assert seen == [False, True, True]
    bad = {"model": MODEL, "messages": HI, "max_tokens": 2, "disable_spec_decode": "sometimes"}
    assert_error(client.post(CHAT, json=bad), 400, param="disable_spec_decode")
