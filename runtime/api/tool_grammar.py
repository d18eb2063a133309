"""The grammar that forces Gemma-4 tool calls, in Gemma's own syntax (not JSON), so that the model
writes what it was trained on: `<|tool_call>call:NAME{key:value,...}<tool_call|>`, keys in the
order the chat template renders them (dictsort), strings between `<|"|>`, each value following its
tool's `parameters` schema: types, enum, const, required keys, nullable, anyOf/oneOf, string
lengths and item counts (other keywords, such as numeric ranges or patterns, are not enforced).
`tool_choice: required` takes one call of any tool (several when `parallel_tool_calls` allows), a
named function exactly one call of it. Written in llguidance's Lark dialect: special tokens by id
(`<[id]>`), which text rules can never produce."""

from __future__ import annotations

import json
from collections.abc import Sequence

from runtime.api.chat import Tool, ToolChoice, ToolChoiceFunction
from runtime.generate.grammar import Grammar

INT = r"/-?(0|[1-9][0-9]{0,15})/"
NUMBER = r"/-?(0|[1-9][0-9]{0,15})(\.[0-9]{1,16})?([eE][-+]?[0-9]{1,2})?/"
KEY = r"/[A-Za-z_][A-Za-z0-9_]{0,63}/"
# String text: anything but the two control characters transformers' argument dialect reserves.
TEXT = r"[^\x01\x02]"
MAX_ITEMS = 16  # maxItems up to this is spelt out in the grammar; larger ones are not enforced
THOUGHT_OPEN = "<|channel>thought\n"  # a prompt ending so leaves the model inside its thought


def template_order(mapping: dict) -> list[tuple]:
    """Items in the order the chat template writes them: Jinja's dictsort, which ignores case."""
    return sorted(mapping.items(), key=lambda item: item[0].lower())


def key(name: str) -> str:
    """`name:` as a Lark literal (a JSON string, so any property name is written exactly)."""
    return json.dumps(f"{name}:")


class _Rules:
    """Lark rules named as they are made; one per schema node keeps the grammar linear in the schema."""

    def __init__(self, quote: int):
        self.quote = quote
        self.lines: list[str] = []
        self.has_any = False  # the rules for values of any shape are written once, when first needed

    def add(self, body: str) -> str:
        name = f"r{len(self.lines)}"
        self.lines.append(f"{name}: {body}")
        return name

    def string(self, schema: dict) -> str:
        low, top = schema.get("minLength", 0), schema.get("maxLength")
        text = f"/{TEXT}{{{low},{top}}}/" if isinstance(top, int) else f"/{TEXT}{{{low},}}/"
        return self.add(f"<[{self.quote}]> {text} <[{self.quote}]>")

    def array(self, schema: dict) -> str:
        """`[v,...]` with minItems..maxItems items (no upper bound past MAX_ITEMS)."""
        item = self.value(schema.get("items"))
        low, top = schema.get("minItems", 0), schema.get("maxItems")
        more = f'("," {item})*' if top is None or top > MAX_ITEMS else ""
        if not more:  # up to top - low further items, each optional after the one before
            for _ in range(top - max(low, 1)):
                more = f'("," {item} {more})?'.replace(" )", ")")
        first = [item] + [f'"," {item}'] * (low - 1)
        body = " ".join(first) + (f" {more}" if more else "")
        if top == 0:
            return self.add('"[]"')
        return self.add(f'"[" {body} "]"' if low else f'"[" ({body})? "]"')

    def literal(self, value) -> str:
        """One enum/const value as the template writes it."""
        if isinstance(value, str):
            return f"<[{self.quote}]> {json.dumps(value)} <[{self.quote}]>"
        if isinstance(value, bool) or value is None:
            return json.dumps(value)
        if isinstance(value, (int, float)):
            return json.dumps(str(value))
        if isinstance(value, list):
            return '"[" ' + ' "," '.join(self.literal(v) for v in value) + ' "]"' if value else '"[]"'
        return '"{" ' + ' "," '.join(f"{key(k)} {self.literal(v)}" for k, v in template_order(value)) + ' "}"'

    def value(self, schema) -> str:
        """A rule for any value the schema allows (anything, for schema features not modelled here)."""
        if not isinstance(schema, dict) or not schema:
            return self.any()
        if "const" in schema:
            return self.add(self.literal(schema["const"]))
        if "enum" in schema:
            return self.add(" | ".join(self.literal(v) for v in schema["enum"]))
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self.add(" | ".join(self.value(s) for s in schema[key]))
        types = schema.get("type")
        if isinstance(types, list):
            return self.add(" | ".join(self.value(schema | {"type": t}) for t in types))
        if schema.get("nullable"):
            return self.add(f'{self.value({k: v for k, v in schema.items() if k != "nullable"})} | "null"')
        match types:
            case "string":
                return self.string(schema)
            case "integer":
                return self.add(INT)
            case "number":
                return self.add(NUMBER)
            case "boolean":
                return self.add('"true" | "false"')
            case "null":
                return self.add('"null"')
            case "array":
                return self.array(schema)
            case "object":
                return self.object(schema) if schema.get("properties") else self.any_object()
        return self.any()

    def object(self, schema: dict) -> str:
        """`{k:v,...}` in sorted key order; required keys always, the others optional, commas between."""
        props = template_order(schema.get("properties", {}))
        required = set(schema.get("required", ()))
        values = [self.value(s) for _, s in props]
        # tail[i, lead]: the keys from i on, `lead` when a key came before (so a comma goes first).
        tail: dict[tuple[int, bool], str] = {(len(props), False): "", (len(props), True): ""}
        for i in range(len(props) - 1, -1, -1):
            for lead in (False, True):
                comma = '"," ' if lead else ""
                item = f"{comma}{key(props[i][0])} {values[i]} {tail[i + 1, True]}".strip()
                rest = tail[i + 1, lead]
                if props[i][0] in required:
                    tail[i, lead] = self.add(item)
                else:
                    tail[i, lead] = self.add(f"({item}) | {rest}" if rest else f"({item})?")
        return self.add(f'"{{" {tail[0, False]} "}}"' if props else '"{}"')

    def any_object(self) -> str:
        self.any()
        return "anyobject"

    def any(self) -> str:
        if not self.has_any:
            self.has_any = True
            self.lines += [
                f'anyvalue: <[{self.quote}]> /{TEXT}*/ <[{self.quote}]> | {NUMBER} | "true" | "false" | "null" '
                '| anyobject | "[" (anyvalue ("," anyvalue)*)? "]"',
                'anyobject: "{" (anypair ("," anypair)*)? "}"',
                f'anypair: {KEY} ":" anyvalue',
            ]
        return "anyvalue"


def forced_calls(tokenizer, tools: Sequence[Tool], name: str | None, parallel: bool, thought_open: bool = False) -> str:
    """Lark text for `tool_choice` `required` (name None) or a named function. `thought_open`: the
    prompt ends inside the thought channel (thinking after a tool result), which the calls close first."""
    ids = dict(
        zip(
            ("open", "close", "quote", "eoc"),
            tokenizer.convert_tokens_to_ids(["<|tool_call>", "<tool_call|>", '<|"|>', "<channel|>"]),
        )
    )
    rules = _Rules(ids["quote"])
    calls = []
    for tool in tools:
        if name is None or tool.function.name == name:
            # No parameters: the function takes none (OpenAI's reading); a schema: its object.
            params = tool.function.parameters
            args = rules.value({"type": "object"} | params) if params is not None else rules.add('"{}"')
            calls.append(f'"call:{tool.function.name}" {args}')
    call = rules.add(f"<[{ids['open']}]> ({' | '.join(calls)}) <[{ids['close']}]>")
    body = f"{call}+" if parallel and name is None else call
    return "\n".join([f"start: <[{ids['eoc']}]> {body}" if thought_open else f"start: {body}", *rules.lines])


def forced(
    tokenizer, tools: Sequence[Tool] | None, tool_choice: ToolChoice | None, parallel: bool | None, prompt: str
) -> tuple[str, Grammar] | None:
    """The grammar a `tool_choice` imposes, named by that field: None for `auto` and `none`."""
    if not tools or tool_choice in (None, "auto", "none"):
        return None
    name = tool_choice.function.name if isinstance(tool_choice, ToolChoiceFunction) else None
    lark = forced_calls(tokenizer, tools, name, parallel is not False, prompt.endswith(THOUGHT_OPEN))
    return "tool_choice", Grammar.lark(lark)
