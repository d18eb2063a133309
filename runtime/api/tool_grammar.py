"""The grammar that forces Gemma-4 tool calls, in Gemma's own syntax (not JSON), so that the model
writes what it was trained on: `<|tool_call>call:NAME{key:value,...}<tool_call|>`, each call's
arguments the Lark rules of its tool's `parameters` (tool_schema_rules.py).

`tool_choice: required` takes one call of any tool (several when `parallel_tool_calls` allows), a
named function exactly one call of it; with thinking on, a thought may come first. Written in
llguidance's Lark dialect: special tokens by id (`<[id]>`), which text rules can never produce."""

from __future__ import annotations

import json
from collections.abc import Sequence

from runtime.api.chat import ChatTemplateError
from runtime.api.chat_protocol import Tool, ToolChoice, ToolChoiceFunction
from runtime.api.tool_names import ToolNames
from runtime.api.tool_schema_rules import TEXT, SchemaRules
from runtime.generate.grammar import Grammar
from runtime.settings import GrammarLimits


def arguments_schema(params: dict, where: str) -> dict:
    """A function's `parameters` as the schema of its arguments, which are an object: a list of types
    narrows to its "object" (a call's arguments written as `false` are no call the reply can read)."""
    kinds = params.get("type", "object")
    if kinds != "object" and not (isinstance(kinds, list) and "object" in kinds):
        raise ChatTemplateError(
            f"{where}.type", 'must be "object" (or a list of types that has it): arguments are an object'
        )
    return params | {"type": "object"}


def forced_calls(
    tokenizer,
    tools: Sequence[Tool],
    name: str | None,
    parallel: bool,
    limits: GrammarLimits | None = None,
    names: ToolNames | None = None,
    thinking: bool = False,
) -> str:
    """Lark text for `tool_choice` `required` (name None) or a named function. `names`: the aliases the
    prompt gave the tools (a name Gemma's syntax cannot carry); `thinking`: a thought may come first."""
    ids = dict(
        zip(
            ("open", "close", "quote", "soc", "eoc"),
            tokenizer.convert_tokens_to_ids(["<|tool_call>", "<tool_call|>", '<|"|>', "<|channel>", "<channel|>"]),
        )
    )
    names = names or ToolNames(t.function.name for t in tools)
    rules = SchemaRules(ids["quote"], limits or GrammarLimits())
    calls = []
    for i, tool in enumerate(tools):
        if name is None or tool.function.name == name:
            # No parameters: the function takes none (OpenAI's reading); a schema: its object.
            params = tool.function.parameters
            where = f"tools.{i}.function.parameters"
            args = rules.value(arguments_schema(params, where), params, where) if params is not None else '"{}"'
            calls.append(f"{json.dumps('call:' + names.alias(tool.function.name))} {args}")
    call = rules.add(f"<[{ids['open']}]> ({' | '.join(calls)}) <[{ids['close']}]>")
    body = f"{call}+" if parallel and name is None else call
    if thinking:
        body = f'(<[{ids["soc"]}]> "thought\\n" /{TEXT}*/ <[{ids["eoc"]}]>)? {body}'
    return "\n".join([f"start: {body}", *rules.lines])


def forced(
    tokenizer,
    tools: Sequence[Tool] | None,
    tool_choice: ToolChoice | None,
    parallel: bool | None,
    limits: GrammarLimits,
    names: ToolNames,
    thinking: bool = False,
) -> tuple[str, Grammar] | None:
    """The grammar a `tool_choice` imposes, named by that field: None for `auto` and `none`."""
    if not tools or tool_choice in (None, "auto", "none"):
        return None
    name = tool_choice.function.name if isinstance(tool_choice, ToolChoiceFunction) else None
    lark = forced_calls(tokenizer, tools, name, parallel is not False, limits, names, thinking)
    return "tool_choice", Grammar.lark(lark)
