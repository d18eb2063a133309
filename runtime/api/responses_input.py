"""A Responses body as the chat completions request the chat route serves: `instructions` and `input`
items as chat messages, and tools, tool_choice, text.format and reasoning as their chat fields.
`responses.py` turns the reply back into Responses output items."""

from __future__ import annotations

from runtime.api.openai_errors import APIError
from runtime.api.responses_protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    ReasoningItem,
    ResponsesRequest,
    ResponsesToolChoice,
)


def chat_messages(body: ResponsesRequest) -> list[dict]:
    """`instructions` and `input` as chat messages: a function_call joins the assistant message just
    before it (or starts one), a function_call_output is a `tool` message naming its function, and
    a reasoning item is the `reasoning_content` of the assistant message that follows it."""
    out: list[dict] = [{"role": "system", "content": body.instructions}] if body.instructions else []
    names: dict[str, str] = {}  # call_id -> function name
    thought: str | None = None
    turn_open = False  # the last message is the model's, and a function_call may join it

    def assistant(content: str | None) -> dict:
        nonlocal thought
        msg: dict = {"role": "assistant", "content": content}
        if thought is not None:
            msg["reasoning_content"], thought = thought, None
        out.append(msg)
        return msg

    for i, item in enumerate(body.input):
        if isinstance(item, ReasoningItem):
            thought = (thought or "") + item.text()
            continue
        if isinstance(item, FunctionCallItem):
            msg = out[-1] if turn_open else assistant(None)
            msg.setdefault("tool_calls", []).append(
                {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            )
            names[item.call_id] = item.name
            turn_open = True
        elif isinstance(item, FunctionCallOutputItem):
            if item.call_id not in names:
                raise APIError(
                    400,
                    f"input.{i}.call_id: no function_call item before it has call_id {item.call_id!r}",
                    param=f"input.{i}.call_id",
                    code="invalid_value",
                )
            out.append(
                {"role": "tool", "tool_call_id": item.call_id, "name": names[item.call_id], "content": item.text()}
            )
            turn_open = False
        elif item.role == "assistant":
            assistant(item.text())
            turn_open = True
        else:  # a user message may carry images and audio (the chat request checks the other roles)
            out.append({"role": item.role, "content": item.chat_content(f"input.{i}")})
            turn_open = False
    return out


def chat_request(body: ResponsesRequest) -> dict:
    """The chat completions body that asks the engine for what `body` asks."""
    out: dict = {
        "model": body.model,
        "messages": chat_messages(body),
        "stream": bool(body.stream),
        "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "seed": body.seed,
        "parallel_tool_calls": body.parallel_tool_calls,
        "user": body.user,
        "metadata": body.metadata,
        "structured_outputs": body.structured_outputs,
    }
    if body.tools:
        out["tools"] = [t.chat() for t in body.tools]
    if isinstance(body.tool_choice, ResponsesToolChoice):
        out["tool_choice"] = {"type": "function", "function": {"name": body.tool_choice.name}}
    else:
        out["tool_choice"] = body.tool_choice
    fmt = body.text.format if body.text else None
    if fmt is not None and fmt.type == "json_schema":
        if fmt.schema_ is None:
            raise APIError(
                400, "text.format: type json_schema needs a schema", param="text.format.schema", code="invalid_value"
            )
        spec = {
            "name": fmt.name or "response",
            "schema": fmt.schema_,
            "strict": fmt.strict,
            "description": fmt.description,
        }
        out["response_format"] = {
            "type": "json_schema",
            "json_schema": {k: v for k, v in spec.items() if v is not None},
        }
    elif fmt is not None and fmt.type == "json_object":
        out["response_format"] = {"type": "json_object"}
    if body.reasoning is not None:
        out["chat_template_kwargs"] = {"enable_thinking": body.reasoning.thinking}
    return {k: v for k, v in out.items() if v is not None}
