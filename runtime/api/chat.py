"""Chat requests in, the checkpoint's chat template's prompt out; a parsed reply back in OpenAI's shape.

Requests: messages of every OpenAI role (a `tool` message answers an assistant's `tool_calls`, whose
`arguments` JSON text is decoded for the template), `tools`, `tool_choice`, and the thinking switch
(`chat_template_kwargs: {"enable_thinking": true}`, or `{"thinking": true}` as vLLM also accepts).
Replies: `reasoning_content`, `content` and `tool_calls`, whole or as stream deltas, as vLLM's
OpenAI server shapes them."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationInfo, field_validator, model_validator

from contract.errors import Gemma4Error
from runtime.api.reply_parser import Content, Piece, Reasoning, ToolCall

# Gemma-4's call syntax (`call:NAME{...}`) carries names of word characters only.
NAME = re.compile(r"\w+")


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
        if not NAME.fullmatch(self.name):
            raise ValueError(
                f"function name {self.name!r}: Gemma-4's call syntax carries only letters, digits and underscores"
            )
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

    def template_dict(self, where: str) -> dict:
        out: dict = {"role": "system" if self.role == "developer" else self.role, "content": self.content or ""}
        for i, c in enumerate(self.tool_calls or ()):
            args = arguments(c.function.arguments, f"{where}.tool_calls.{i}")
            out.setdefault("tool_calls", []).append(
                {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": args}}
            )
        for key in ("tool_call_id", "name", "reasoning_content"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


class ChatTemplateError(Gemma4Error, ValueError):
    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def arguments(text: str, where: str) -> dict:
    """An assistant tool call's `arguments` JSON text as the object the template renders."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ChatTemplateError(f"{where}.function.arguments", f"is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ChatTemplateError(f"{where}.function.arguments", "must be a JSON object")
    return value


def template_kwargs(kwargs: dict | None) -> dict:
    """chat_template_kwargs for the template; vLLM's `thinking` is Gemma's `enable_thinking`."""
    out = dict(kwargs or {})
    if "thinking" in out:
        out.setdefault("enable_thinking", out.pop("thinking"))
    if not isinstance(out.get("enable_thinking", False), bool):
        raise ChatTemplateError("chat_template_kwargs.enable_thinking", "must be true or false")
    return out


def render(
    tokenizer, messages: list[Message], tools: list[Tool] | None, tool_choice: ToolChoice | None, kwargs: dict | None
) -> str:
    """The prompt text. With `tool_choice: none` the tools are left out of the prompt, so the model is
    never offered them (vLLM's `--exclude-tools-when-tool-choice-none`)."""
    offered = tools if tools and tool_choice != "none" else None
    if isinstance(tool_choice, ToolChoiceFunction) and not any(
        t.function.name == tool_choice.function.name for t in tools or ()
    ):
        raise ChatTemplateError("tool_choice", f"names function {tool_choice.function.name!r}, which is not in tools")
    if tool_choice == "required" and not tools:
        raise ChatTemplateError("tool_choice", "is 'required' but no tools are given")
    dicts = [m.template_dict(f"messages.{i}") for i, m in enumerate(messages)]
    return tokenizer.apply_chat_template(
        dicts,
        tools=[t.model_dump(exclude_none=True) for t in offered] if offered else None,
        add_generation_prompt=True,
        tokenize=False,
        **template_kwargs(kwargs),
    )


class Reply:
    """The pieces of one choice, gathered into the final message; `delta` shapes one piece for a stream."""

    def __init__(self):
        self.reasoning: list[str] = []
        self.content: list[str] = []
        self.calls: list[ToolCall] = []

    def add(self, piece: Piece) -> dict:
        """Record a piece; returns its stream delta."""
        if isinstance(piece, Reasoning):
            self.reasoning.append(piece.text)
            return {"reasoning_content": piece.text}
        if isinstance(piece, Content):
            self.content.append(piece.text)
            return {"content": piece.text}
        self.calls.append(piece)
        return {"tool_calls": [{"index": len(self.calls) - 1} | call_json(piece)]}

    def finish_reason(self, reason: str, named_tool: bool = False) -> str:
        """`tool_calls` when the reply called a tool of its own choice (`auto`, `required`); a call forced
        by a named `tool_choice` ends with `stop`, as OpenAI's API and vLLM (serving_chat.py:
        is_finish_reason_tool_calls) answer it."""
        return "tool_calls" if self.calls and reason == "stop" and not named_tool else reason

    def message(self) -> dict:
        content = "".join(self.content)
        out: dict = {"role": "assistant", "content": content if content or not self.calls else None}
        if self.reasoning:
            out["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            out["tool_calls"] = [call_json(c) for c in self.calls]
        return out


def call_json(call: ToolCall) -> dict:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
