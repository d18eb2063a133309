"""The `openai` client, unchanged: chat (sampled, streamed, n, parse, forced tools and their round
trip), completions (a list of prompts, streamed too) and responses (string and item input,
instructions, forced function calls and their output, parse, thinking, max_output_tokens, the
event stream, the stateless refusals)."""

from __future__ import annotations

import json
import urllib.request

import openai
from checks import BASE_URL, MODEL, SEEDS, TEMPERATURE, check, report
from pydantic import BaseModel, Field

client = openai.OpenAI(base_url=BASE_URL, api_key="unused", max_retries=0)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
CHAT_WEATHER = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
ASK = "Weather in Paris?"


class City(BaseModel):  # bounded: a random model does not end a free string or number on its own
    name: str = Field(max_length=10)
    capital: bool  # no free numbers: a random model does not end one on its own


def weather_args(text: str) -> dict:
    args = json.loads(text)
    assert set(args) == {"city", "unit"} and args["unit"] in ("c", "f") and isinstance(args["city"], str), args
    return args


# -- chat ----------------------------------------------------------------------------------------------
@check
def chat_sampled_and_streamed():
    for seed in SEEDS:
        kw = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "seed": seed}
        whole = client.chat.completions.create(temperature=TEMPERATURE, **kw)
        assert whole.choices[0].finish_reason in ("stop", "length") and whole.usage.completion_tokens >= 1
        chunks = list(client.chat.completions.create(temperature=TEMPERATURE, stream=True, **kw))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == (whole.choices[0].message.content or ""), (streamed, whole.choices[0].message.content)
    two = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, n=2, logprobs=True, top_logprobs=2
    )
    assert [c.index for c in two.choices] == [0, 1] and len(two.choices[0].logprobs.content[0].top_logprobs) == 2


@check
def chat_parse_pydantic():
    for seed in SEEDS:
        done = client.chat.completions.parse(
            model=MODEL,
            messages=[{"role": "user", "content": "A city?"}],
            response_format=City,
            temperature=TEMPERATURE,
            seed=seed,
            max_tokens=120,
        )
        assert isinstance(done.choices[0].message.parsed, City), done.choices[0].message


@check
def chat_forced_tool_round_trip():
    for seed in SEEDS:
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            first = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": ASK}],
                tools=[CHAT_WEATHER],
                tool_choice=choice,
                temperature=TEMPERATURE,
                seed=seed,
                max_tokens=48,
            )
            [call] = first.choices[0].message.tool_calls
            weather_args(call.function.arguments)
            history = [
                {"role": "user", "content": ASK},
                first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
            ]
            second = client.chat.completions.create(
                model=MODEL, messages=history, tools=[CHAT_WEATHER], temperature=TEMPERATURE, seed=seed, max_tokens=6
            )
            assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")


# -- completions ---------------------------------------------------------------------------------------
@check
def completions_prompt_list():
    prompts = ["The sky", "A cat", "One two"]
    whole = client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=3, temperature=0)
    assert [c.index for c in whole.choices] == list(range(6)), [c.index for c in whole.choices]
    for p in prompts:  # choice i * n + j answers prompt i: the same text as the prompt alone
        alone = client.completions.create(model=MODEL, prompt=p, max_tokens=3, temperature=0).choices[0].text
        i = prompts.index(p)
        assert whole.choices[2 * i].text == alone == whole.choices[2 * i + 1].text, (p, alone)
    singles = sum(client.completions.create(model=MODEL, prompt=p, max_tokens=3).usage.prompt_tokens for p in prompts)
    assert whole.usage.prompt_tokens == singles and whole.usage.completion_tokens == 6 * 3, whole.usage
    texts = {}
    for c in client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=3, temperature=0, stream=True):
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
    assert [texts[i] for i in range(6)] == [c.text for c in whole.choices], texts


@check
def completions_suffix_refused():
    try:
        client.completions.create(model=MODEL, prompt="def f(", suffix="return 1", max_tokens=3)
    except openai.BadRequestError as exc:
        assert exc.body["param"] == "suffix", exc.body
    else:
        raise AssertionError("suffix was not refused")


# -- responses -----------------------------------------------------------------------------------------
@check
def responses_string_and_items():
    for seed in SEEDS:
        r = client.responses.create(
            model=MODEL,
            input="Hi",
            instructions="Be brief.",
            temperature=TEMPERATURE,
            extra_body={"seed": seed},
            max_output_tokens=6,
        )
        assert r.status in ("completed", "incomplete") and r.output[-1].type == "message", r
        assert r.usage.input_tokens > 0 and 1 <= r.usage.output_tokens <= 6
        assert r.output_text == r.output[-1].content[0].text
    items = [
        {"role": "user", "content": "Hi"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Again"}]},
    ]
    r = client.responses.create(model=MODEL, input=items, max_output_tokens=4)
    assert (
        r.usage.input_tokens
        > client.responses.create(model=MODEL, input="Again", max_output_tokens=1).usage.input_tokens
    )


@check
def responses_max_output_tokens():
    r = client.responses.create(model=MODEL, input="Hi", max_output_tokens=1, temperature=0)
    assert r.usage.output_tokens == 1
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"


@check
def responses_function_call_round_trip():
    for seed in SEEDS:
        for choice in ("required", {"type": "function", "name": "get_weather"}):
            r = client.responses.create(
                model=MODEL,
                input=ASK,
                tools=[WEATHER],
                tool_choice=choice,
                temperature=TEMPERATURE,
                extra_body={"seed": seed},
                max_output_tokens=48,
            )
            [call] = [o for o in r.output if o.type == "function_call"]
            assert call.name == "get_weather" and call.call_id
            weather_args(call.arguments)
            history = [{"role": "user", "content": ASK}, *[o.model_dump(exclude_none=True) for o in r.output]]
            history.append({"type": "function_call_output", "call_id": call.call_id, "output": "sunny"})
            after = client.responses.create(
                model=MODEL,
                input=history,
                tools=[WEATHER],
                temperature=TEMPERATURE,
                extra_body={"seed": seed},
                max_output_tokens=6,
            )
            assert after.status in ("completed", "incomplete") and after.usage.input_tokens > r.usage.input_tokens


@check
def responses_parse_pydantic():
    for seed in SEEDS:
        r = client.responses.parse(
            model=MODEL,
            input="A city?",
            text_format=City,
            temperature=TEMPERATURE,
            extra_body={"seed": seed},
            max_output_tokens=120,
        )
        assert isinstance(r.output_parsed, City), r.output_text


def special_ids(*tokens: str) -> list[int]:
    """Token ids from the server's /tokenize (vLLM's route beside /v1)."""
    body = json.dumps({"prompt": "".join(tokens), "add_special_tokens": False}).encode()
    req = urllib.request.Request(BASE_URL.removesuffix("/v1") + "/tokenize", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as resp:
        return json.load(resp)["tokens"]


@check
def responses_reasoning_item():
    first = client.responses.create(
        model=MODEL, input=ASK, tools=[WEATHER], tool_choice="required", max_output_tokens=48
    )
    history = [{"role": "user", "content": ASK}, *[o.model_dump(exclude_none=True) for o in first.output]]
    history.append({"type": "function_call_output", "call_id": first.output[-1].call_id, "output": "sunny"})
    # the random model made to think, then answer, by a grammar (vLLM's structured_outputs extension)
    soc, eoc = special_ids("<|channel>", "<channel|>")
    grammar = f'start: <[{soc}]> "thought\\n" /[a-z]{{3,12}}/ <[{eoc}]> /[a-z]{{1,6}}/'
    r = client.responses.create(
        model=MODEL,
        input=history,
        tools=[WEATHER],
        reasoning={"effort": "medium"},
        max_output_tokens=40,
        temperature=TEMPERATURE,
        extra_body={"structured_outputs": {"grammar": grammar}},
    )
    assert [o.type for o in r.output] == ["reasoning", "message"] and r.output[0].content[0].text, r.output
    assert 1 <= r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens
    history += [o.model_dump(exclude_none=True) for o in r.output]  # the reasoning item goes back as input
    history.append({"role": "user", "content": "Thanks"})
    again = client.responses.create(model=MODEL, input=history, reasoning={"effort": "low"}, max_output_tokens=2)
    alone = client.responses.create(model=MODEL, input="Thanks", reasoning={"effort": "low"}, max_output_tokens=1)
    assert again.status in ("completed", "incomplete") and again.usage.input_tokens > alone.usage.input_tokens


@check
def responses_stream_event_sequence():
    for seed in SEEDS:
        events = list(
            client.responses.create(
                model=MODEL,
                input="Hi",
                stream=True,
                temperature=TEMPERATURE,
                extra_body={"seed": seed},
                max_output_tokens=6,
            )
        )
        kinds = [e.type for e in events]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        head = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
        tail = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
        assert kinds[:4] == head and kinds[-4:-1] == tail, kinds
        assert kinds[-1] in ("response.completed", "response.incomplete")
        assert set(kinds[4:-4]) == {"response.output_text.delta"}, kinds
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert text == events[-1].response.output_text and events[-1].response.usage.output_tokens >= 1
    with client.responses.stream(
        model=MODEL, input=ASK, tools=[WEATHER], tool_choice="required", max_output_tokens=48
    ) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    weather_args(final.output[-1].arguments)


@check
def responses_stateless_refusals():
    for extra, param in (({"store": True}, "store"), ({"previous_response_id": "resp_1"}, "previous_response_id")):
        try:
            client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, **extra)
        except openai.BadRequestError as exc:
            assert exc.body["param"] == param and "stateless" in exc.body["message"], exc.body
        else:
            raise AssertionError(f"{param} was not refused")


report()
