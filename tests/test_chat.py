"""Chat requests through the checkpoint's template (tools, tool results, thinking) and replies in
OpenAI's shape (reasoning_content, content, tool_calls), on the random model's chat-sized artifact,
through Flask's client and the official `openai` client."""

from __future__ import annotations

import json
import time
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from runtime.api.chat import ChatTemplateError, chat_call, template_kwargs, template_messages, tool_names
from runtime.api.chat_protocol import Message, Tool
from runtime.api.templating import Templates
from runtime.settings import RequestLimits
from support.chat_server import client, engine, oai  # noqa: F401 (module-scoped fixtures)

CHAT = "/v1/chat/completions"
MODEL = "tiny-e2b"
TEMPLATES = Templates(RequestLimits())


def render(tokenizer, messages, tools, tool_choice, kwargs) -> str:
    return TEMPLATES.render(chat_call(tokenizer, messages, tools, tool_choice, kwargs))


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 8},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer"},
            },
            "required": ["city", "unit"],
        },
    },
}
ASK = {"role": "user", "content": "Weather in Paris?"}
CALLED = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
        }
    ],
}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}
BAD_ARGUMENTS = CALLED | {
    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{city"}}]
}


def sse(resp) -> list[dict]:
    lines = [ln[len("data: ") :] for ln in resp.get_data(as_text=True).split("\n\n") if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(ln) for ln in lines[:-1]]


def prompt_len(engine, messages, tools=None, **kw) -> int:
    """What the template makes of the messages, converted as the server converts them, counted independently."""
    parsed = [Message.model_validate(m) for m in messages]
    converted = template_messages(parsed, tool_names(None, parsed))
    return len(
        engine.tokenizer.apply_chat_template(
            converted, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False, **kw
        )
    )


# -- the request side, without a model --------------------------------------------------------------
def test_thinking_switch_spellings():
    assert template_kwargs({"enable_thinking": True}) == {"enable_thinking": True}
    assert template_kwargs({"thinking": True}) == {"enable_thinking": True}
    with pytest.raises(ChatTemplateError, match="true or false"):
        template_kwargs({"enable_thinking": "yes"})


def test_tool_choice_none_leaves_the_tools_out(engine):
    msgs = [Message.model_validate(ASK)]
    tools = [Tool.model_validate(WEATHER)]
    assert "<|tool>" in render(engine.tokenizer, msgs, tools, "auto", None)
    assert "<|tool>" not in render(engine.tokenizer, msgs, tools, "none", None)


# -- through the server --------------------------------------------------------------------------------
def test_a_tool_result_follow_up_renders_the_calls_and_results(client, engine):
    messages = [ASK, CALLED, RESULT]
    body = {"model": MODEL, "messages": messages, "tools": [WEATHER], "max_tokens": 4, "temperature": 0}
    resp = client.post(CHAT, json=body)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    assert resp.get_json()["usage"]["prompt_tokens"] == prompt_len(engine, messages, [WEATHER])


@pytest.mark.parametrize(
    "change,param",
    [
        ({"messages": [ASK, BAD_ARGUMENTS, RESULT]}, "messages.1.tool_calls.0.function.arguments"),
        ({"messages": [ASK, {"role": "tool", "content": "x"}]}, "messages.1.tool_call_id"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "get.weather"}}]}, "tools.0.function"),
        ({"messages": [ASK, RESULT]}, "messages.1"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"chat_template_kwargs": {"enable_thinking": 1}}, "chat_template_kwargs.enable_thinking"),
    ],
)
def test_bad_tool_requests_get_a_400_naming_the_field(client, change, param):
    body = {"model": MODEL, "messages": [ASK], "tools": [WEATHER], "max_tokens": 2} | change
    resp = client.post(CHAT, json=body)
    assert resp.status_code == 400, resp.get_data(as_text=True)
    assert resp.get_json()["error"]["param"].startswith(param)


THINK_AFTER_RESULT = {
    "model": MODEL,
    "messages": [ASK, CALLED, RESULT],
    "tools": [WEATHER],
    "max_tokens": 8,
    "temperature": 0,
    "chat_template_kwargs": {"enable_thinking": True},
}


def test_reasoning_is_separated_whole_and_streamed(client, engine):
    """Thinking after a tool result: the prompt ends at the result (the model's turn goes on, as the
    checkpoints' template leaves it), and what the model writes in <|channel>thought ... <channel|> is
    reasoning, the rest content. A grammar makes the random model write both."""
    soc, eoc = engine.tokenizer.convert_tokens_to_ids(["<|channel>", "<channel|>"])
    grammar = f'start: <[{soc}]> "thought\\n" /[a-z]{{3,12}}/ <[{eoc}]> /[a-z]{{1,6}}/'
    body = THINK_AFTER_RESULT | {"guided_grammar": grammar, "max_tokens": 40}
    whole = client.post(CHAT, json=body).get_json()
    message = whole["choices"][0]["message"]
    assert whole["usage"]["prompt_tokens"] == prompt_len(engine, [ASK, CALLED, RESULT], [WEATHER], enable_thinking=True)
    assert message["reasoning_content"].isalpha() and message["content"].isalpha(), message
    events = sse(client.post(CHAT, json=body | {"stream": True}))
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == message["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == message["content"]
    # vLLM's spelling of the switch renders the same prompt.
    same = client.post(CHAT, json=body | {"chat_template_kwargs": {"thinking": True}}).get_json()
    assert same["usage"] == whole["usage"] and same["choices"][0]["message"] == message


# -- forced tool calls (the grammar writes Gemma's call syntax) -------------------------------------
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def valid_weather_call(call) -> dict:
    import jsonschema

    assert call.type == "function" and call.function.name == "get_weather" and call.id
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    return args


@pytest.mark.parametrize("tool_choice", [NAMED, "required"])
def test_a_forced_call_round_trips_with_the_openai_client(oai, engine, tool_choice):
    """call -> role: tool result -> answer, on the random model: the grammar makes the call valid."""
    first = oai.chat.completions.create(
        model=MODEL, messages=[ASK], tools=[WEATHER], tool_choice=tool_choice, max_tokens=64, temperature=0
    )
    choice = first.choices[0]
    # OpenAI and vLLM: a call the model chose (required) ends with tool_calls, a named one with stop
    assert choice.finish_reason == ("stop" if tool_choice == NAMED else "tool_calls")
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    valid_weather_call(call)
    history = [
        ASK,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    second = oai.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], max_tokens=6, temperature=0)
    assert second.choices[0].finish_reason in ("stop", "length")
    assert second.usage.prompt_tokens == prompt_len(engine, history, [WEATHER])


def test_streamed_tool_calls_assemble_in_the_openai_client(oai):
    kw = {
        "model": MODEL,
        "messages": [ASK],
        "tools": [WEATHER],
        "tool_choice": NAMED,
        "max_tokens": 64,
        "temperature": 0,
    }
    whole = oai.chat.completions.create(**kw).choices[0].message.tool_calls
    with oai.chat.completions.stream(**kw) as stream:
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "stop"  # a named tool_choice, as vLLM streams it too
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == [
        (c.function.name, c.function.arguments) for c in whole
    ]
    valid_weather_call(final.message.tool_calls[0])


def test_parallel_tool_calls_false_gives_one_call(client):
    body = {
        "model": MODEL,
        "messages": [ASK],
        "tools": [WEATHER],
        "tool_choice": "required",
        "max_tokens": 96,
        "parallel_tool_calls": False,
        "temperature": 1.0,
    }
    for seed in range(3):
        message = client.post(CHAT, json=body | {"seed": seed}).get_json()["choices"][0]["message"]
        assert len(message["tool_calls"]) == 1, message


def test_turn_end_and_tool_response_end_generation(engine):
    """<turn|> ends a reply and <|tool_response> a tool call: both are end-of-generation ids."""
    ends = set(engine.tokenizer.convert_tokens_to_ids(["<turn|>", "<|tool_response>", "<eos>"]))
    assert ends <= set(engine.model.meta.eos_token_ids)


def test_turn_end_stops_a_reply_and_special_tokens_stay_out_of_content(client, engine):
    turn_end, image = engine.tokenizer.convert_tokens_to_ids(["<turn|>", "<|image|>"])
    body = {"model": MODEL, "messages": [ASK], "max_tokens": 5, "temperature": 0}
    ended = client.post(CHAT, json=body | {"logit_bias": {str(turn_end): 100}}).get_json()
    assert ended["choices"][0]["finish_reason"] == "stop" and ended["usage"]["completion_tokens"] == 1
    assert ended["choices"][0]["message"]["content"] == ""
    pushed = body | {"logit_bias": {str(image): 100}}
    clean = client.post(CHAT, json=pushed).get_json()["choices"][0]["message"]["content"]
    kept = client.post(CHAT, json=pushed | {"skip_special_tokens": False}).get_json()["choices"][0]["message"][
        "content"
    ]
    assert clean == "" and kept == "<|image|>" * 5


def test_an_agent_library_sized_prompt_fits(client):
    """Agent libraries bring long prompts of their own (pydantic-ai's prompted output ~650 tokens,
    instructor's JSON modes ~500): the chat artifact's context holds them."""
    schema_talk = " ".join(f"field_{i} must be a string," for i in range(48))
    messages = [{"role": "system", "content": f"Answer with JSON. {schema_talk}"}, ASK]
    resp = client.post(CHAT, json={"model": MODEL, "messages": messages, "max_tokens": 2, "temperature": 0})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    assert resp.get_json()["usage"]["prompt_tokens"] >= 700


# -- tool names and schemas as clients send them -----------------------------------------------------
READ = {
    "type": "function",
    "function": {
        "name": "read-file",
        "description": "Read a file",
        "parameters": {
            "type": "object",
            "properties": {"file-path": {"type": "string", "maxLength": 8}},
            "required": ["file-path"],
            "additionalProperties": False,
        },
    },
}


def test_a_hyphenated_tool_is_declared_called_and_answered_under_an_alias(engine):
    """The prompt carries the alias everywhere the name appears; the key is written bare, as is."""
    call = {"id": "c1", "type": "function", "function": {"name": "read-file", "arguments": '{"file-path": "a.txt"}'}}
    history = [
        ASK,
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "hi"},
    ]
    msgs = [Message.model_validate(m) for m in history]
    text = render(engine.tokenizer, msgs, [Tool.model_validate(READ)], "auto", None)
    assert "declaration:read_file{" in text and "call:read_file{file-path:" in text
    assert "response:read_file{" in text and "read-file" not in text


@pytest.mark.parametrize("seed", range(4))
def test_hyphenated_names_and_keys_reach_the_client_as_declared(oai, seed):
    kw = {
        "model": MODEL,
        "messages": [ASK],
        "tools": [READ],
        "tool_choice": "required",
        "max_tokens": 48,
        "temperature": 1.0,
        "seed": seed,
    }
    first = oai.chat.completions.create(**kw).choices[0]
    assert first.finish_reason == "tool_calls" and first.message.content is None
    [call] = first.message.tool_calls
    assert call.function.name == "read-file" and list(json.loads(call.function.arguments)) == ["file-path"]
    with oai.chat.completions.stream(**kw) as stream:
        final = stream.get_final_completion().choices[0]
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == [
        (call.function.name, call.function.arguments)
    ]


class Inner(BaseModel):
    x: int
    label: Literal["a", "b"] | None = None


class Lookup(BaseModel):
    inner: Inner
    many: list[Inner] = Field(default_factory=list, max_length=2)


@pytest.mark.parametrize("seed", range(4))
def test_nested_models_are_followed_through_their_refs(oai, seed):
    """pydantic's nested models arrive as $ref into $defs; the call follows them, sampled at T=1."""
    tool = {"type": "function", "function": {"name": "lookup", "parameters": Lookup.model_json_schema()}}
    reply = oai.chat.completions.create(
        model=MODEL,
        messages=[ASK],
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "lookup"}},
        max_tokens=160,
        temperature=1.0,
        seed=seed,
    )
    [call] = reply.choices[0].message.tool_calls
    Lookup.model_validate_json(call.function.arguments)
    assert set(json.loads(call.function.arguments)["inner"]) <= {"x", "label"}


def test_an_empty_strict_object_gives_empty_arguments(oai):
    empty = {"type": "object", "properties": {}, "additionalProperties": False}
    tool = {"type": "function", "function": {"name": "get_time", "parameters": empty}}
    for seed in range(3):
        reply = oai.chat.completions.create(
            model=MODEL, messages=[ASK], tools=[tool], tool_choice="required", max_tokens=16, temperature=1.0, seed=seed
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [("get_time", "{}")]


def nested_types(levels: int, kinds: int) -> dict:
    schema: dict = {"type": "string", "maxLength": 2}
    for _ in range(levels):
        schema = {"type": ["object"] * kinds, "properties": {"a": schema}, "required": ["a"]}
    return schema


def test_a_branching_schema_builds_a_small_grammar_at_once(client):
    """Eight levels of six-way type lists (under a kilobyte) once grew the worker without bound."""
    tool = {"type": "function", "function": {"name": "f", "parameters": nested_types(8, 6)}}
    body = {"model": MODEL, "messages": [ASK], "tools": [tool], "tool_choice": "required", "max_tokens": 40}
    start = time.perf_counter()
    resp = client.post(CHAT, json=body | {"temperature": 0})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    assert time.perf_counter() - start < 20  # the reply itself, on the CPU model; the grammar takes ~1 ms
    [call] = resp.get_json()["choices"][0]["message"]["tool_calls"]
    depth, args = 0, json.loads(call["function"]["arguments"])
    while isinstance(args, dict):
        args, depth = args["a"], depth + 1
    assert depth == 8 and isinstance(args, str)


def test_a_schema_past_a_cap_gets_a_400_naming_it(client):
    tool = {"type": "function", "function": {"name": "f", "parameters": nested_types(80, 1)}}
    body = {"model": MODEL, "messages": [ASK], "tools": [tool], "tool_choice": "required", "max_tokens": 4}
    resp = client.post(CHAT, json=body)
    assert resp.status_code == 400
    error = resp.get_json()["error"]
    assert error["param"].startswith("tools.0.function.parameters") and "GEMMA4_SCHEMA_MAX_DEPTH" in error["message"]
    assert len(resp.get_data()) < 2048


class Person(BaseModel):
    name: str = Field(max_length=6)
    age: int = Field(ge=0, le=150)


@pytest.mark.parametrize("seed", range(6))
def test_structured_output_refuses_undeclared_properties(oai, seed):
    """pydantic's schema as instructor sends it (no additionalProperties), sampled at T=1.5: the
    object closes after its declared fields, as xgrammar's default compile in vLLM does."""
    fmt = {"type": "json_schema", "json_schema": {"name": "Person", "schema": Person.model_json_schema()}}
    reply = oai.chat.completions.create(
        model=MODEL, messages=[ASK], response_format=fmt, max_tokens=200, temperature=1.5, seed=seed
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert list(json.loads(choice.message.content)) == ["name", "age"]


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"chat_template": '{{ "" }}'}, "chat_template_kwargs.chat_template"),  # off unless the operator trusts
        *(
            ({name: True}, f"chat_template_kwargs.{name}")  # apply_chat_template's own arguments
            for name in ("tokenize", "conversation", "tools", "add_generation_prompt", "continue_final_message")
        ),
        ({"enable_thinking": True, "other": {"x": 1}}, "chat_template_kwargs.other"),
        ({f"k{i}": True for i in range(17)}, "chat_template_kwargs"),
    ],
)
def test_chat_template_kwargs_take_only_the_templates_switches(kwargs, param):
    with pytest.raises(ChatTemplateError) as info:
        template_kwargs(kwargs)
    assert info.value.param == param


def test_a_trusted_request_template_and_an_operators_switch_pass():
    limits = RequestLimits(trust_request_chat_template=True, chat_template_switches=("enable_thinking", "style"))
    kwargs = {"chat_template": "{{ messages[0]['content'] }}", "style": "terse"}
    assert template_kwargs(kwargs, limits) == kwargs
    with pytest.raises(ChatTemplateError, match="at most 256"):
        template_kwargs({"style": "x" * 300}, limits)
    with pytest.raises(ChatTemplateError, match="GEMMA4_MAX_REQUEST_TEMPLATE_BYTES"):
        template_kwargs({"chat_template": "x" * (1 << 20)}, limits)
