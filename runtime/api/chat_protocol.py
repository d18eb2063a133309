"""The chat request's messages and tools as OpenAI defines them, strictly typed: messages of every
role (a tool message names the call it answers, only an assistant's carries `tool_calls`, only a
user's carries image and audio parts), content parts (`text`, `image_url`, `input_audio`), function
tools with OpenAI's name rule, `tool_choice`, and the chat completions body that holds them
(ChatCompletionRequest, on protocol.py's GenerationRequest). chat.py renders them through the template."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PlainValidator,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from runtime.api.media_prompt import MediaPart
from runtime.api.openai_errors import APIError
from runtime.api.protocol import GenerationRequest
from runtime.api.tool_names import OPENAI_NAME
from runtime.log_gate import shown


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


# -- content parts: as the openai client sends them (openai.types.chat's ChatCompletionContentPart*Param).
# A list of text parts only is the text it joins to; a list with media keeps its parts in order, so the
# chat template can put each placeholder where its part is.
class TextPart(_Strict):
    type: Literal["text"]
    text: str

    def template(self) -> dict:
        return {"type": "text", "text": self.text}


class ImageURL(_Strict):
    url: str  # a data: URL, or an http(s) URL the operator's hosts allow
    detail: Literal["auto", "low", "high", "original"] | None = None  # accepted; Gemma-4 has one budget per image


class ImagePart(_Strict):
    type: Literal["image_url"]
    image_url: ImageURL

    def template(self) -> dict:
        return {"type": "image"}

    def media(self, where: str) -> MediaPart:
        return MediaPart("image", f"{where}.image_url.url", self.image_url.url)


class InputAudio(_Strict):
    data: str  # base64
    format: Literal["wav", "mp3"]


class AudioPart(_Strict):
    type: Literal["input_audio"]
    input_audio: InputAudio

    def template(self) -> dict:
        return {"type": "audio"}

    def media(self, where: str) -> MediaPart:
        return MediaPart("audio", f"{where}.input_audio.data", self.input_audio.data, self.input_audio.format)


Part = Annotated[TextPart | ImagePart | AudioPart, Discriminator("type")]
PARTS: TypeAdapter[TextPart | ImagePart | AudioPart] = TypeAdapter(Part)
KINDS = "text, image_url and input_audio"


def content_parts(value) -> str | list[TextPart | ImagePart | AudioPart] | None:
    """A message's content: a string, None, or a list of parts (only text: the string they join to)."""
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise ValueError(f"must be a string or a list of content parts ({KINDS})")
    parts = []
    for j, item in enumerate(value):
        kind = item.get("type") if isinstance(item, dict) else None
        try:
            parts.append(PARTS.validate_python(item))
        except ValidationError as exc:
            what = exc.errors()[0]
            field = ".".join(str(p) for p in what["loc"][1:])  # past the union's tag
            if what["type"] == "union_tag_invalid" or not isinstance(item, dict) or "type" not in item:
                raise ValueError(f"part {j} has type {kind!r}; the parts this server takes are {KINDS}") from None
            raise ValueError(f"part {j} ({kind}): {field + ': ' if field else ''}{what['msg']}") from None
    if all(isinstance(p, TextPart) for p in parts):
        return "".join(p.text for p in parts)  # type: ignore[union-attr]  # all text parts
    return parts


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
    content: Annotated[str | list[Part] | None, PlainValidator(content_parts)] = Field(
        default=None, validate_default=True
    )

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
        if isinstance(value, list) and info.data.get("role") != "user":
            raise ValueError("only user messages carry image_url and input_audio parts")
        return value

    def text(self) -> str:
        """The message's text (a list's text parts joined)."""
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content if isinstance(p, TextPart))
        return self.content or ""

    def media(self, where: str) -> list[MediaPart]:
        """Its image and audio parts, in order, each named by its place in the request."""
        parts = self.content if isinstance(self.content, list) else []
        return [p.media(f"{where}.content.{j}") for j, p in enumerate(parts) if not isinstance(p, TextPart)]


class ChatCompletionRequest(GenerationRequest):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    def parses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    def media_parts(self) -> list[MediaPart]:
        """Its messages' image and audio parts, in the order the prompt holds them."""
        parts = [part for i, m in enumerate(self.messages) for part in m.media(f"messages.{i}")]
        if parts and self.prompt_logprobs is not None:
            raise APIError(
                400,
                "prompt_logprobs: not available for a prompt with images or audio (their soft tokens prefill whole)",
                param="prompt_logprobs",
                code="unsupported_parameter",
            )
        return parts

    def logprob_alternatives(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(400, "top_logprobs: needs logprobs: true", param="top_logprobs", code="invalid_value")
        return (self.top_logprobs or 0) if self.logprobs else None
