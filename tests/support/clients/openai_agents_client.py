"""openai-agents, unchanged: an agent with a function tool on its default model (the Responses API)
and on the chat-completions model. tool_choice "required" makes the turn call the tool (the server's
grammar writes the call, the SDK parses it and runs the tool)."""

from __future__ import annotations

from typing import Literal

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_default_openai_client,
    set_tracing_disabled,
)
from checks import BASE_URL, MODEL, SEEDS, TEMPERATURE, check, report
from openai import AsyncOpenAI

set_tracing_disabled(True)
client = AsyncOpenAI(base_url=BASE_URL, api_key="unused", max_retries=0)
set_default_openai_client(client, use_for_tracing=False)
asked: list[str] = []


@function_tool
def get_weather(city: Literal["paris", "rome"]) -> str:
    """The weather in a city."""
    asked.append(city)
    return "sunny"


def run(model, seed: int) -> None:
    """The tool's output is the answer (stop_on_first_tool): a random model's free text would run to
    max_tokens, which the SDK takes for a failure on the Responses API (`response.incomplete`)."""
    asked.clear()
    settings = ModelSettings(tool_choice="required", temperature=TEMPERATURE, max_tokens=48, extra_body={"seed": seed})
    agent = Agent(
        name="weather",
        instructions="Answer.",
        tools=[get_weather],
        model=model,
        model_settings=settings,
        tool_use_behavior="stop_on_first_tool",
    )
    result = Runner.run_sync(agent, "Weather in Paris?", max_turns=3)
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item"] and asked and asked[0] in ("paris", "rome"), kinds
    assert result.final_output == "sunny" and result.raw_responses[0].usage.input_tokens > 0


@check
def agent_on_the_default_responses_model():
    for seed in SEEDS:
        run(MODEL, seed)


@check
def agent_on_the_chat_completions_model():
    for seed in SEEDS:
        run(OpenAIChatCompletionsModel(model=MODEL, openai_client=client), seed)


report()
