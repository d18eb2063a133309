"""Request bodies of OpenAI's Responses API (`POST /v1/responses`), as the `openai` client's
`responses.create` / `responses.parse` and the agent frameworks send them (openai.types.responses).

Input is a string (one user message) or a list of items: messages of any role, `function_call` items
the model made and the `function_call_output` items answering them, and `reasoning` items carrying a
thought back. The same field policy as the other endpoints: known fields strictly typed, unknown ones
logged once and ignored. The server keeps no state, so `store: true`, `previous_response_id` and
`background` are refused by name (see `stateless`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Discriminator, Field, Tag, model_validator

from runtime.api.media_prompt import MediaPart
from runtime.api.openai_errors import APIError
from runtime.api.protocol import LenientModel


class ResponseTextPart(LenientModel):
    """A text part of a message's content."""

    type: Literal["input_text", "output_text", "text", "refusal"]
    text: str | None = None
    refusal: str | None = None

    def value(self) -> str:
        return (self.refusal if self.type == "refusal" else self.text) or ""

    def chat(self, where: str) -> dict:
        return {"type": "text", "text": self.value()}

    def media(self, where: str) -> MediaPart | None:
        return None


class InputImagePart(LenientModel):
    """An image (openai's ResponseInputImageParam): `image_url` is a data: URL or an http(s) URL of a
    host the operator allows; a `file_id` needs a file store, which this server does not keep."""

    type: Literal["input_image"]
    detail: Literal["low", "high", "auto", "original"] = "auto"  # accepted; Gemma-4 has one budget per image
    image_url: str | None = None
    file_id: str | None = None

    def chat(self, where: str) -> dict:
        if self.image_url is None:
            param = f"{where}.file_id" if self.file_id is not None else f"{where}.image_url"
            raise APIError(
                400,
                f"{param}: this server keeps no files; send the image as image_url (a data: URL)",
                param=param,
                code="unsupported_parameter" if self.file_id is not None else "invalid_value",
            )
        return {"type": "image_url", "image_url": {"url": self.image_url, "detail": self.detail}}

    def media(self, where: str) -> MediaPart | None:
        return None if self.image_url is None else MediaPart("image", f"{where}.image_url", self.image_url)


class AudioData(LenientModel):
    data: str  # base64
    format: Literal["mp3", "wav"]


class InputAudioPart(LenientModel):
    """An audio clip (openai's ResponseInputAudioParam), base64 in `input_audio.data`."""

    type: Literal["input_audio"]
    input_audio: AudioData

    def chat(self, where: str) -> dict:
        return {"type": "input_audio", "input_audio": self.input_audio.model_dump(include={"data", "format"})}

    def media(self, where: str) -> MediaPart | None:
        return MediaPart("audio", f"{where}.input_audio.data", self.input_audio.data, self.input_audio.format)


InputPart = Annotated[ResponseTextPart | InputImagePart | InputAudioPart, Discriminator("type")]


class MessageItem(LenientModel):
    """A message: OpenAI's EasyInputMessage (no `type`, string content) or a typed one (a list of parts)."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputPart]
    id: str | None = None
    status: str | None = None

    @model_validator(mode="after")
    def _media_from_the_user(self) -> MessageItem:
        # An assistant's or a system's image would be dropped from its text or refused by the chat
        # request under the chat's own path; refused here, named by this item's.
        if self.role != "user" and not isinstance(self.content, str):
            if any(not isinstance(p, ResponseTextPart) for p in self.content):
                raise ValueError("only user messages carry input_image and input_audio parts")
        return self

    def text(self) -> str:
        """The text parts joined (the media parts are the chat message's: chat_content)."""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.value() for p in self.content if isinstance(p, ResponseTextPart))

    def chat_content(self, where: str) -> str | list[dict]:
        """The content as a chat message carries it: the text, or its parts in order when one is media."""
        if isinstance(self.content, str) or all(isinstance(p, ResponseTextPart) for p in self.content):
            return self.text()
        return [p.chat(f"{where}.content.{j}") for j, p in enumerate(self.content)]

    def media(self, where: str) -> list[MediaPart]:
        """Its image and audio parts, in order, each named by its place in the Responses request."""
        parts = [] if isinstance(self.content, str) else self.content
        return [m for j, p in enumerate(parts) if (m := p.media(f"{where}.content.{j}")) is not None]


class FunctionCallItem(LenientModel):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(LenientModel):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ResponseTextPart]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.value() for p in self.output)


class ReasoningPart(LenientModel):
    type: Literal["summary_text", "reasoning_text"]
    text: str


class ReasoningItem(LenientModel):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningPart] = Field(default_factory=list)
    content: list[ReasoningPart] | None = None
    encrypted_content: str | None = None
    status: str | None = None

    def text(self) -> str:
        """The thought itself (`content`), else its summary."""
        return "".join(p.text for p in self.content or self.summary)


def _items(value: Any) -> Any:
    """A string input is one user message."""
    return [{"role": "user", "content": value}] if isinstance(value, str) else value


def _item_kind(value: Any) -> str:
    return value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", "message")


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_kind),
]


class FunctionTool(LenientModel):
    """A function tool, flat as the Responses API spells it (chat nests it under `function`)."""

    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def chat(self) -> dict:
        fn = {"name": self.name, "description": self.description, "parameters": self.parameters, "strict": self.strict}
        return {"type": "function", "function": {k: v for k, v in fn.items() if v is not None}}


class ResponsesToolChoice(LenientModel):
    type: Literal["function"]
    name: str


class TextFormat(LenientModel):
    """`text.format`: plain text, any JSON object, or JSON of a schema (what `responses.parse` sends)."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextConfig(LenientModel):
    format: TextFormat | None = None
    verbosity: str | None = None


class ReasoningConfig(LenientModel):
    """`reasoning`: an effort other than "none" turns Gemma-4's thinking on (it has no levels of effort)."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: str | None = None
    generate_summary: str | None = None

    @property
    def thinking(self) -> bool:
        return self.effort not in (None, "none")


class ResponsesRequest(LenientModel):
    model: str
    input: Annotated[list[InputItem], BeforeValidator(_items)]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ResponsesToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)  # vLLM's extension, as on the other endpoints
    structured_outputs: dict[str, Any] | None = None  # vLLM's extension: checked as the chat endpoint checks it
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)
    stream: bool | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    background: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None

    def media_parts(self) -> list[MediaPart]:
        """Its image and audio parts in the order the prompt holds them (the chat messages it becomes
        keep the items' order), each named by its own path (input.N.content.M...), not the chat's."""
        items = enumerate(self.input)
        return [p for i, item in items if isinstance(item, MessageItem) for p in item.media(f"input.{i}")]

    def stateless(self) -> None:
        """This server keeps no responses: what needs one stored is refused, naming the field."""
        for name, asked, why in (
            ("previous_response_id", self.previous_response_id is not None, "send the whole conversation as input"),
            ("store", self.store is True, "send store: false (or leave it out) and the whole conversation as input"),
            ("background", self.background is True, "send background: false (or leave it out)"),
        ):
            if asked:
                raise APIError(
                    400,
                    f"{name}: this server keeps no responses (stateless); {why}",
                    param=name,
                    code="unsupported_parameter",
                )
