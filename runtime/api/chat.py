"""Chat requests in (chat_protocol.py), the checkpoint's chat template's prompt out.

Requests: messages of every OpenAI role, `tools`, `tool_choice`, and the thinking switch
(`chat_template_kwargs: {"enable_thinking": true}`, or `{"thinking": true}` as vLLM also accepts; the
template's other switches only as the operator lists them, a template of the request's own only as
the operator allows).
Before any template sees them, the messages take the shape Gemma-4's own template reads (as llama.cpp's
Gemma-4 handler does, following Google's prompt-formatting guide): an assistant message with
`tool_calls`, the `role: "tool"` messages answering it and the assistant's answer after them become
one model message with `tool_calls` (arguments decoded from their JSON text), `tool_responses`
(`{name, response}`, a result that is JSON text decoded) and `content`; the template leaves that turn
open when no answer follows. Tool names Gemma's call syntax cannot carry get aliases (tool_names.py).
The reply goes back in OpenAI's shape from chat_reply.py."""

from __future__ import annotations

import json

from contract.errors import Gemma4Error
from runtime.api.chat_protocol import Message, Tool, ToolChoice, ToolChoiceFunction
from runtime.api.templating import TemplateCall, template_call
from runtime.api.tool_names import ToolNames
from runtime.log_gate import shown
from runtime.settings import RequestLimits


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
    except RecursionError:
        raise ChatTemplateError(f"{where}.function.arguments", "nests too deeply to be read") from None
    if not isinstance(value, dict):
        raise ChatTemplateError(f"{where}.function.arguments", "must be a JSON object")
    return value


def template_dict(m: Message, where: str, names: ToolNames) -> dict:
    """One message as the template's dict, its calls' names aliased and their arguments decoded, a
    list of parts as the template's parts (text, and `image` / `audio` where its placeholder goes)."""
    content = [p.template() for p in m.content] if isinstance(m.content, list) else m.content or ""
    out: dict = {"role": "system" if m.role == "developer" else m.role, "content": content}
    for i, c in enumerate(m.tool_calls or ()):
        args = arguments(c.function.arguments, f"{where}.tool_calls.{i}")
        out.setdefault("tool_calls", []).append(
            {"id": c.id, "type": "function", "function": {"name": names.alias(c.function.name), "arguments": args}}
        )
    if m.reasoning_content is not None:
        out["reasoning_content"] = m.reasoning_content
    return out


SWITCH_VALUE_CHARS = 256  # a string a template switch may take
DEFAULTS = RequestLimits()


def template_kwargs(kwargs: dict | None, limits: RequestLimits = DEFAULTS) -> dict:
    """chat_template_kwargs for the template: only its own switches (`limits.chat_template_switches`,
    vLLM's `thinking` standing for Gemma's `enable_thinking`), as scalars; a template of the request's
    own only when the operator trusts them. apply_chat_template's own arguments (tokenize, tools,
    conversation ...) are the server's to set, so they are never switches."""
    out = dict(kwargs or {})
    if len(out) > limits.max_template_kwargs:
        raise ChatTemplateError(
            "chat_template_kwargs",
            f"has {len(out)} entries; at most {limits.max_template_kwargs} are allowed (GEMMA4_MAX_TEMPLATE_KWARGS)",
        )
    if "thinking" in out:
        out.setdefault("enable_thinking", out.pop("thinking"))
    for key, value in out.items():
        param = f"chat_template_kwargs.{key}"
        if key == "chat_template":
            request_template(value, limits)
        elif key not in limits.chat_template_switches:
            raise ChatTemplateError(
                param,
                f"is not a switch of this server's chat template; allowed: "
                f"{', '.join(limits.chat_template_switches) or 'none'} (GEMMA4_CHAT_TEMPLATE_SWITCHES)",
            )
        elif not (value is None or isinstance(value, bool | int | float | str)) or (
            isinstance(value, str) and len(value) > SWITCH_VALUE_CHARS
        ):
            raise ChatTemplateError(param, f"must be a boolean, a number or a string of at most {SWITCH_VALUE_CHARS}")
    if not isinstance(out.get("enable_thinking", False), bool):
        raise ChatTemplateError("chat_template_kwargs.enable_thinking", "must be true or false")
    return out


def request_template(value: object, limits: RequestLimits) -> None:
    param = "chat_template_kwargs.chat_template"
    if not limits.trust_request_chat_template:
        raise ChatTemplateError(
            param,
            "a request's own chat template is not accepted by this server (the operator may allow it "
            "with GEMMA4_TRUST_REQUEST_CHAT_TEMPLATE=true)",
        )
    if not isinstance(value, str) or len(value.encode()) > limits.max_request_template_bytes:
        raise ChatTemplateError(
            param,
            f"must be a template of at most {limits.max_request_template_bytes} bytes "
            "(GEMMA4_MAX_REQUEST_TEMPLATE_BYTES)",
        )


def tool_names(tools: list[Tool] | None, messages: list[Message]) -> ToolNames:
    """The aliases for this request: its tools' names and the ones its earlier calls used."""
    called = (c.function.name for m in messages for c in m.tool_calls or ())
    return ToolNames([*(t.function.name for t in tools or ()), *called])


def tool_result(content: str | None):
    """A tool's result as the template renders it: decoded when it is JSON text (as llama.cpp does), as
    text when it is not (or nests too deeply to decode)."""
    try:
        return json.loads(content or "")
    except (json.JSONDecodeError, RecursionError):
        return content or ""


def template_messages(messages: list[Message], names: ToolNames) -> list[dict]:
    """OpenAI's messages in the shape Gemma-4's template reads (see the module's docstring)."""
    out: list[dict] = []
    i = 0
    while i < len(messages):
        m, where = messages[i], f"messages.{i}"
        if m.role == "tool":
            raise ChatTemplateError(
                where, "a tool message must follow the assistant message whose tool_calls it answers"
            )
        turn = template_dict(m, where, names)
        out.append(turn)
        i += 1
        if not m.tool_calls:
            continue
        by_id = {c.id: c.function.name for c in m.tool_calls}
        responses: list[dict] = []
        while i < len(messages) and messages[i].role == "tool":
            t = messages[i]
            # Matched by id; a result for an unknown id takes the call in its position.
            nth = m.tool_calls[min(len(responses), len(m.tool_calls) - 1)].function.name
            responses.append(
                {"name": names.alias(by_id.get(t.tool_call_id or "", nth)), "response": tool_result(t.text())}
            )
            i += 1
        if responses:
            turn["tool_responses"] = responses
        # The answer after the results ends the same model turn; the calling message's own text gives way
        # to it (the template writes content after the results).
        turn["content"] = ""
        if i < len(messages) and messages[i].role == "assistant" and not messages[i].tool_calls and messages[i].text():
            turn["content"] = messages[i].text()
            i += 1
    return out


def chat_call(
    tokenizer,
    messages: list[Message],
    tools: list[Tool] | None,
    tool_choice: ToolChoice | None,
    kwargs: dict | None,
    names: ToolNames | None = None,
    limits: RequestLimits = DEFAULTS,
) -> TemplateCall:
    """What the chat template renders the prompt from (runtime.api.templating renders it). With
    `tool_choice: none` the tools are left out of the prompt, so the model is never offered them
    (vLLM's `--exclude-tools-when-tool-choice-none`)."""
    names = names or tool_names(tools, messages)
    offered = tools if tools and tool_choice != "none" else None
    if isinstance(tool_choice, ToolChoiceFunction) and not any(
        t.function.name == tool_choice.function.name for t in tools or ()
    ):
        name = shown(tool_choice.function.name)
        raise ChatTemplateError("tool_choice", f"names function {name}, which is not in tools")
    if tool_choice == "required" and not tools:
        raise ChatTemplateError("tool_choice", "is 'required' but no tools are given")
    declared = [
        t.model_dump(exclude_none=True)
        | {"function": t.function.model_dump(exclude_none=True) | {"name": names.alias(t.function.name)}}
        for t in offered or ()
    ]
    converted = template_messages(messages, names)
    return template_call(tokenizer, converted, declared or None, True, template_kwargs(kwargs, limits))
