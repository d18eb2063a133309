"""langchain-openai, unchanged: invoke and stream, bind_tools with a forced tool, with_structured_output
in its three methods (json_schema, function_calling, json_mode), and the Responses API
(`use_responses_api=True`) for the same."""

from __future__ import annotations

from typing import Literal

from checks import BASE_URL, MODEL, SEEDS, TEMPERATURE, check, report
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field


class City(BaseModel):
    """A city."""

    name: str = Field(max_length=12)
    capital: bool  # no free numbers: a random model does not end one on its own


@tool
def get_weather(city: Literal["paris", "rome"]) -> str:
    """The weather in a city."""
    return "sunny"


def llm(seed: int, **kw) -> ChatOpenAI:
    return ChatOpenAI(
        model=MODEL,
        base_url=BASE_URL,
        api_key="unused",
        temperature=TEMPERATURE,
        extra_body={"seed": seed},
        max_tokens=80,
        max_retries=0,
        **kw,
    )


def invoke_and_stream(**kw):
    for seed in SEEDS:
        whole = llm(seed, **kw).invoke("Hi")
        assert isinstance(whole.text, str) and whole.usage_metadata["output_tokens"] >= 1, whole
        streamed = "".join(chunk.text for chunk in llm(seed, **kw).stream("Hi"))
        assert streamed == whole.text, (streamed, whole.text)


def forced_tool(**kw):
    for seed in SEEDS:
        for choice in ("get_weather", "required"):
            msg = llm(seed, **kw).bind_tools([get_weather], tool_choice=choice).invoke("Weather in Paris?")
            [call] = msg.tool_calls
            assert call["name"] == "get_weather" and call["args"]["city"] in ("paris", "rome"), call


def structured(methods, **kw):
    for seed in SEEDS:
        for method in methods:
            schema = City.model_json_schema() if method == "json_mode" else City
            out = llm(seed, **kw).with_structured_output(schema, method=method).invoke("A city, as JSON?")
            if method == "json_mode":  # no schema goes to the server: any JSON object
                assert isinstance(out, dict), out
            else:
                assert isinstance(out, City), out


@check
def chat_invoke_and_stream():
    invoke_and_stream()


@check
def chat_bind_tools():
    forced_tool()


@check
def chat_with_structured_output():
    structured(("json_schema", "function_calling", "json_mode"))


@check
def responses_invoke_and_stream():
    invoke_and_stream(use_responses_api=True)


@check
def responses_bind_tools():
    forced_tool(use_responses_api=True)


@check
def responses_with_structured_output():
    structured(("json_schema", "function_calling"), use_responses_api=True)


report()
