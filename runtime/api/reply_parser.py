"""A Gemma-4 reply split as it streams: reasoning, content and tool calls.

The text comes decoded with the special tokens kept, since they are the boundaries:
`<|channel>thought\\n ... <channel|>` holds the reasoning, `<|tool_call>call:NAME{...}<tool_call|>` a
call whose arguments are Gemma's syntax (bare keys, strings between `<|"|>`), the rest is content.
The splitting is transformers' streaming `ResponseParser` with the response template transformers
declares for Gemma-4; the arguments go through the JSON dialect that template names. A call whose
arguments do not parse is passed on as content, never dropped and never fatal to the stream."""

from __future__ import annotations

import copy
import json
import re
import uuid
from dataclasses import dataclass, field

from contract.errors import Gemma4Error
from runtime.api.tool_names import ToolNames


class ReplyError(Gemma4Error, RuntimeError):
    pass


@dataclass(frozen=True)
class Reasoning:
    text: str


@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI's `function.arguments`
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")


Piece = Reasoning | Content | ToolCall


def response_template(tokenizer) -> dict:
    """The checkpoint's own `response_template` if it has one, else the one transformers ships for
    Gemma-4 (real checkpoints carry only the older `response_schema`, which transformers no longer reads)."""
    own = getattr(tokenizer, "response_template", None)
    if own:
        return own
    try:
        from transformers.cli.serving.utils import _RESPONSE_TEMPLATE_FALLBACKS
    except ImportError as exc:
        raise ReplyError(f"this transformers has no response templates ({exc}); install transformers>=5.24") from None
    for model_types, template in _RESPONSE_TEMPLATE_FALLBACKS.items():
        if "gemma4" in model_types:
            return template
    raise ReplyError("this transformers ships no Gemma-4 response template; install transformers>=5.24")


def special_tokens(tokenizer) -> tuple[str, ...]:
    return tuple(t.content for t in tokenizer.added_tokens_decoder.values() if t.special)


# A bare key outside strings: after `{` or `,`, up to its `:` (the chat template writes any key so).
BARE_KEY = re.compile(r"(?<=[{,])([^:{}\[\],]+):")
QUOTE = '<|"|>'


def quote_keys(text: str) -> str:
    """Bare keys as JSON strings, outside the `<|"|>` strings: the template's dialect reads only word keys."""
    parts = text.split(QUOTE)
    parts[::2] = [BARE_KEY.sub(lambda m: json.dumps(m.group(1)) + ":", p) for p in parts[::2]]
    return QUOTE.join(parts)


def parse_arguments(text: str, template: dict) -> dict:
    """Gemma's argument syntax to a dict, with the dialect the template declares (ValueError if malformed)."""
    from transformers.utils.chat_parsing.content_parsers import parse_content

    spec = template["fields"]["tool_calls"]
    value = parse_content(quote_keys(text), spec["content"], spec.get("content_args", {}))
    if not isinstance(value, dict):
        raise ValueError(f"tool call arguments are not an object: {text!r}")
    return value


class ReplyParser:
    """Feed decoded text, get pieces in order. `tools` off: calls are not parsed, their text is content.
    `skip_special_tokens` (the default, as in OpenAI's servers): no special token reaches the client.
    `names`: the tools' aliases in the prompt, so that a call carries its real name."""

    def __init__(
        self, tokenizer, prompt: str, tools: bool, skip_special_tokens: bool = True, names: ToolNames | None = None
    ):
        self.names = names or ToolNames(())
        from transformers.utils.chat_parsing import ResponseParser

        self.template = response_template(tokenizer)
        spec = copy.deepcopy(self.template)
        if tools:
            # Arguments are taken as raw text and parsed here, so a malformed call cannot break the stream.
            spec["fields"]["tool_calls"] |= {"content": "text", "content_args": {"strip": False}}
        else:
            del spec["fields"]["tool_calls"]
        self._parser = ResponseParser(spec, prefix=prompt)
        specials = sorted(special_tokens(tokenizer), key=len, reverse=True)
        self._strip = re.compile("|".join(map(re.escape, specials))) if skip_special_tokens and specials else None
        # What the prompt already opened (an empty thought block, or a thought the model continues).
        self._pending = self._pieces(self._parser.initial_events)

    def feed(self, text: str) -> list[Piece]:
        out, self._pending = self._pending + self._pieces(self._parser.feed(text)), []
        return out

    def finish(self) -> list[Piece]:
        _, events = self._parser.finalize()
        out, self._pending = self._pending + self._pieces(events), []
        return out

    def _clean(self, text: str) -> str:
        return self._strip.sub("", text) if self._strip else text

    def _pieces(self, events: list[dict]) -> list[Piece]:
        out: list[Piece] = []
        for ev in events:
            kind, name = ev["type"], ev.get("field")
            if kind == "region_chunk" and name in ("reasoning_content", "content"):
                text = self._clean(ev["text"])
                if text:
                    out.append(Reasoning(text) if name == "reasoning_content" else Content(text))
            elif kind == "region_close" and name == "tool_calls":
                fn = ev["value"]["function"]
                try:  # JSON has no infinities: an overflowing number is malformed too
                    arguments = json.dumps(
                        parse_arguments(fn["arguments"], self.template), ensure_ascii=False, allow_nan=False
                    )
                except ValueError:
                    text = self._clean(f"<|tool_call>call:{fn['name']}{fn['arguments']}<tool_call|>")
                    if text:
                        out.append(Content(text))
                    continue
                out.append(ToolCall(self.names.real(fn["name"]), arguments))
        return out
