"""One choice's reply in OpenAI's chat shape: the parsed pieces (reasoning, content, tool calls)
gathered into the final message, or each as a stream delta, as vLLM's OpenAI server shapes them."""

from __future__ import annotations

from runtime.api.reply_parser import Content, Piece, Reasoning, ToolCall


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
