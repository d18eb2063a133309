"""litellm, unchanged: completion through its hosted_vllm/ and openai/ providers (sampled, streamed,
a forced tool), and litellm.responses."""

from __future__ import annotations

import json

import litellm
from checks import BASE_URL, MODEL, SEEDS, TEMPERATURE, check, report

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"enum": ["paris", "rome"]}}, "required": ["city"]},
    },
}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


def provider(prefix: str) -> None:
    kw = {"model": f"{prefix}/{MODEL}", "api_base": BASE_URL, "api_key": "unused", "max_tokens": 8}
    for seed in SEEDS:
        whole = litellm.completion(messages=MESSAGES, temperature=TEMPERATURE, seed=seed, **kw)
        assert whole.choices[0].finish_reason in ("stop", "length") and whole.usage.completion_tokens >= 1
        chunks = litellm.completion(messages=MESSAGES, temperature=TEMPERATURE, seed=seed, stream=True, **kw)
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == (whole.choices[0].message.content or ""), (streamed, whole.choices[0].message.content)
        called = litellm.completion(
            messages=MESSAGES,
            tools=[WEATHER],
            tool_choice="required",
            temperature=TEMPERATURE,
            seed=seed,
            **kw | {"max_tokens": 32},
        )
        [call] = called.choices[0].message.tool_calls
        assert json.loads(call.function.arguments)["city"] in ("paris", "rome"), call


@check
def hosted_vllm_provider():
    provider("hosted_vllm")


@check
def openai_provider():
    provider("openai")


@check
def responses():
    for seed in SEEDS:
        r = litellm.responses(
            model=f"openai/{MODEL}",
            api_base=BASE_URL,
            api_key="unused",
            input="Hi",
            max_output_tokens=6,
            temperature=TEMPERATURE,
            seed=seed,
        )
        texts = [c.text for o in r.output if o.type == "message" for c in o.content]
        assert r.usage.output_tokens >= 1 and len(texts) == 1, r


report()
