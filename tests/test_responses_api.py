"""/v1/responses through the official `openai` client (in process) on the random model's chat-sized
artifact: what a Responses request becomes for the chat pipeline (checked against the prompt the
chat endpoint makes of the same conversation), output items, usage, the event stream in order, and
the stateless refusals."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from runtime.api.responses_input import chat_request
from runtime.api.responses_protocol import ResponsesRequest
from support.chat_server import client, engine, oai  # noqa: F401 (module-scoped fixtures)
from support.http import assert_error

MODEL = "tiny-e2b"
PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather", "parameters": PARAMS}
ASK = "Weather in Paris?"
SEEDS = (1, 2, 3, 4)


class City(BaseModel):
    name: str = Field(max_length=10)
    population: int = Field(ge=0, le=10**6)


def chat_prompt_tokens(client, body: dict) -> int:
    """The prompt the chat endpoint makes of the chat request a Responses body translates to."""
    chat = chat_request(ResponsesRequest.model_validate(body)) | {"max_completion_tokens": 1}
    resp = client.post("/v1/chat/completions", json=chat)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    return resp.get_json()["usage"]["prompt_tokens"]


def call_round_trip_input(first) -> list[dict]:
    [call] = [o for o in first.output if o.type == "function_call"]
    return [
        {"role": "user", "content": ASK},
        *[o.model_dump(exclude_none=True) for o in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
    ]


# -- the request, translated -------------------------------------------------------------------------
def test_items_become_chat_messages():
    body = ResponsesRequest.model_validate(
        {
            "model": MODEL,
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": "Hi"},
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "t"}],
                },
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "sun"}]},
                {"type": "function_call_output", "call_id": "c2", "output": "noon"},
            ],
            "text": {"format": {"type": "json_schema", "name": "x", "schema": PARAMS, "strict": True}},
            "reasoning": {"effort": "low"},
            "tool_choice": {"type": "function", "name": "get_weather"},
            "max_output_tokens": 9,
        }
    )
    chat = chat_request(body)
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "content": "Hello",
            "reasoning_content": "t",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "sun"},
        {"role": "tool", "tool_call_id": "c2", "name": "get_time", "content": "noon"},
    ]
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": PARAMS, "strict": True},
    }
    assert chat["chat_template_kwargs"] == {"enable_thinking": True}
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert chat["max_completion_tokens"] == 9


def test_string_input_with_instructions_renders_as_the_chat_endpoint_does(oai, client):
    body = {"model": MODEL, "input": "Hi", "instructions": "Be brief.", "max_output_tokens": 3, "temperature": 0}
    r = oai.responses.create(**body)
    assert r.status in ("completed", "incomplete") and r.id.startswith("resp_") and r.object == "response"
    [msg] = r.output
    assert msg.type == "message" and msg.role == "assistant" and r.output_text == msg.content[0].text
    assert r.usage.input_tokens == chat_prompt_tokens(client, body)
    assert 1 <= r.usage.output_tokens <= 3 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.instructions == "Be brief." and r.max_output_tokens == 3


def test_max_output_tokens_marks_the_response_incomplete(oai, engine):
    # a newline-free long answer: the stop tokens are pushed away, so only the limit ends it
    r = oai.responses.create(model=MODEL, input="Hi", max_output_tokens=2, temperature=0)
    assert r.usage.output_tokens <= 2
    if r.usage.output_tokens == 2:
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
        assert r.output[-1].status == "incomplete"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}])
def test_a_forced_function_call_round_trips(oai, client, seed, choice):
    first = oai.responses.create(
        model=MODEL,
        input=ASK,
        tools=[WEATHER],
        tool_choice=choice,
        temperature=1.0,
        extra_body={"seed": seed},
        max_output_tokens=48,
    )
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), PARAMS)
    body = {"model": MODEL, "input": call_round_trip_input(first), "tools": [WEATHER], "max_output_tokens": 4}
    after = oai.responses.create(**body, temperature=1.0, extra_body={"seed": seed})
    assert after.usage.input_tokens == chat_prompt_tokens(client, body) > first.usage.input_tokens


@pytest.mark.parametrize("seed", SEEDS)
def test_parse_gives_the_pydantic_model(oai, seed):
    r = oai.responses.parse(
        model=MODEL,
        input="A city?",
        text_format=City,
        temperature=1.0,
        extra_body={"seed": seed},
        max_output_tokens=100,
    )
    assert isinstance(r.output_parsed, City), r.output_text


def test_thinking_gives_a_reasoning_item_then_the_message(oai, client, engine):
    """Thinking after a tool result, the random model made to think and answer by a grammar (vLLM's
    structured_outputs): the thought is a reasoning item before the message, whole and streamed, and
    goes back as input."""
    first = oai.responses.create(model=MODEL, input=ASK, tools=[WEATHER], tool_choice="required", max_output_tokens=48)
    soc, eoc = engine.tokenizer.convert_tokens_to_ids(["<|channel>", "<channel|>"])
    grammar = f'start: <[{soc}]> "thought\\n" /[a-z]{{3,12}}/ <[{eoc}]> /[a-z]{{1,6}}/'
    body = {"model": MODEL, "input": call_round_trip_input(first), "tools": [WEATHER], "reasoning": {"effort": "high"}}
    kw = {"max_output_tokens": 40, "temperature": 0, "extra_body": {"structured_outputs": {"grammar": grammar}}}
    r = oai.responses.create(**body, **kw)
    thought, msg = r.output
    assert thought.type == "reasoning" and thought.id.startswith("rs_") and thought.content[0].text.strip().isalpha()
    assert msg.type == "message" and r.output_text.isalpha(), r.output
    assert 1 <= r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens
    events = list(oai.responses.create(**body, **kw, stream=True))
    kinds = [e.type for e in events]
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert events[2].item.type == "reasoning" and events[3].part.type == "reasoning_text"
    streamed = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert streamed == thought.content[0].text and events[-1].response.output_text == r.output_text
    # without thinking the prompt has no thinking switch
    plain = oai.responses.create(**body | {"reasoning": {"effort": "none"}}, max_output_tokens=1)
    assert plain.usage.input_tokens < r.usage.input_tokens
    # the reasoning item goes back as input
    again = body | {"input": body["input"] + [o.model_dump(exclude_none=True) for o in r.output]}
    assert oai.responses.create(**again, max_output_tokens=1).usage.input_tokens == chat_prompt_tokens(client, again)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_stream_follows_the_documented_event_sequence(oai, seed):
    kw = {"model": MODEL, "input": "Hi", "temperature": 1.0, "max_output_tokens": 5, "extra_body": {"seed": seed}}
    events = list(oai.responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    final = events[-1].response
    assert kinds[-1] == ("response.incomplete" if final.status == "incomplete" else "response.completed")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-4].text == final.output_text
    whole = oai.responses.create(**kw)  # the same seed: the same reply as the stream's
    assert whole.output_text == final.output_text and whole.usage.output_tokens == final.usage.output_tokens


def test_a_streamed_function_call_has_its_argument_events(oai):
    with oai.responses.stream(
        model=MODEL, input=ASK, tools=[WEATHER], tool_choice="required", max_output_tokens=48
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    call = kinds.index("response.output_item.added")
    assert kinds[call : call + 4] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    [item] = final.output
    assert events[call + 2].arguments == item.arguments and events[call + 3].item.call_id == item.call_id
    jsonschema.validate(json.loads(item.arguments), PARAMS)


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"store": True}, "store"),
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"background": True}, "background"),
    ],
)
def test_what_needs_a_stored_response_is_refused(client, extra, param):
    resp = client.post("/v1/responses", json={"model": MODEL, "input": "Hi"} | extra)
    err = assert_error(resp, 400, param=param, code="unsupported_parameter")
    assert "stateless" in err["message"]


def test_store_false_is_accepted(oai):
    assert oai.responses.create(model=MODEL, input="Hi", store=False, max_output_tokens=1).status


@pytest.mark.parametrize(
    "body,param",
    [
        ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}, "input.0.call_id"),
        ({"input": [{"type": "image_generation_call", "id": "x"}]}, "input.0"),
        ({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        ({"input": "Hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "Hi", "tool_choice": {"type": "function", "name": "missing"}, "tools": [WEATHER]}, "tool_choice"),
    ],
)
def test_bad_requests_get_a_400_naming_the_field(client, body, param):
    resp = client.post("/v1/responses", json={"model": MODEL} | body)
    err = assert_error(resp, 400)
    assert err["param"] is not None and err["param"].startswith(param), err


def test_a_prompt_too_long_is_a_400(oai):
    with pytest.raises(openai.BadRequestError) as info:
        oai.responses.create(model=MODEL, input="word " * 2000)
    assert info.value.code == "context_length_exceeded"
