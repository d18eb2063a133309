"""pydantic-ai, unchanged: nested output types (its default tool output, and NativeOutput as a
json_schema response format), a function tool, on OpenAIChatModel and OpenAIResponsesModel."""

from __future__ import annotations

from typing import Literal

from checks import BASE_URL, MODEL, SEEDS, TEMPERATURE, check, report
from pydantic import BaseModel
from pydantic_ai import Agent, NativeOutput
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider

provider = OpenAIProvider(base_url=BASE_URL, api_key="unused")
MODELS = {
    "chat": OpenAIChatModel(MODEL, provider=provider),
    "responses": OpenAIResponsesModel(MODEL, provider=provider),
}


class Reading(BaseModel):
    unit: Literal["c", "f"]
    freezing: bool  # no free numbers: a random model does not end one on its own


class Report(BaseModel):
    city: Literal["paris", "rome"]
    reading: Reading


def settings(seed: int) -> dict:
    return {"temperature": TEMPERATURE, "seed": seed, "max_tokens": 80}


def nested_output(kind: str) -> None:
    for seed in SEEDS:
        for output in (Report, NativeOutput(Report)):
            result = Agent(MODELS[kind], output_type=output, model_settings=settings(seed)).run_sync("Weather report?")
            assert isinstance(result.output, Report) and isinstance(result.output.reading, Reading), result.output


def with_tool(kind: str) -> None:
    for seed in SEEDS:
        agent = Agent(MODELS[kind], output_type=Report, model_settings=settings(seed))

        @agent.tool_plain
        def get_weather(city: Literal["paris", "rome"]) -> str:
            """The weather in a city."""
            return "sunny"

        result = agent.run_sync("Weather in Paris?")
        assert isinstance(result.output, Report), result.output
        assert result.usage().input_tokens > 0


@check
def chat_model_nested_output():
    nested_output("chat")


@check
def chat_model_tool():
    with_tool("chat")


@check
def responses_model_nested_output():
    nested_output("responses")


@check
def responses_model_tool():
    with_tool("responses")


report()
