"""The chat request's messages and tools as OpenAI defines them, strictly typed: messages of every
role (a tool message names the call it answers, only an assistant's carries `tool_calls`), function
tools with OpenAI's name rule, and `tool_choice`. chat.py renders them through the template."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationInfo, field_validator, model_validator

from runtime.api.tool_names import OPENAI_NAME
from runtime.log_gate import shown


def text_content(value) -> str | None:
    """A string, None, or OpenAI's list of content parts, of which only text is supported."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in value
    ):
        return "".join(p["text"] for p in value)
    raise ValueError('must be a string or a list of {"type": "text", "text": ...} parts (only text is supported)')


class _Strict(BaseModel):
    # vLLM's field policy (runtime.api.routes): known fields strictly typed, unknown ones kept aside, logged, ignored
    model_config = ConfigDict(extra="allow", strict=True)


class FunctionDef(_Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _name(self):
        if not OPENAI_NAME.fullmatch(self.name):
            raise ValueError(f"function name {shown(self.name)}: must match ^[a-zA-Z0-9_-]{{1,64}}$ (OpenAI's rule)")
        return self


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Strict):
    name: str


class ToolChoiceFunction(_Strict):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | ToolChoiceFunction


class FunctionCall(_Strict):
    name: str
    arguments: str


class AssistantToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    name: str | None = None
    tool_calls: list[AssistantToolCall] | None = None
    tool_call_id: str | None = Field(default=None, validate_default=True)
    reasoning_content: str | None = None
    content: Annotated[str | None, PlainValidator(text_content)] = Field(default=None, validate_default=True)

    @field_validator("tool_calls")
    @classmethod
    def _calls(cls, value, info: ValidationInfo):
        if value and info.data.get("role") != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        return value

    @field_validator("tool_call_id")
    @classmethod
    def _answers(cls, value, info: ValidationInfo):
        if value is None and info.data.get("role") == "tool":
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        return value

    @field_validator("content")
    @classmethod
    def _content(cls, value, info: ValidationInfo):
        if value is None and not (info.data.get("role") == "assistant" and info.data.get("tool_calls")):
            raise ValueError("is required (only an assistant message with tool_calls may omit it)")
        return value
