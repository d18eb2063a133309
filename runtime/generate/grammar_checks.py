"""What an output constraint may be before llguidance sees it: its size, its nesting, its number of
rules, choices and schema nodes, each against a limit of `GrammarLimits`.

llguidance's parsers recurse in native code, and a deep enough grammar overflows the thread's stack
and kills the process (a 3,000-rule Lark chain, a `$ref` chain 1,500 definitions deep) where no
exception can be caught; its own limits bound the work it does only once it is parsing. So these
checks come first, in Python, without recursion (a schema nested 100,000 deep must not overflow
Python's stack either). Each refusal names the limit, its variable and the grammar's own figure,
never the grammar's text."""

from __future__ import annotations

import json
import re

from contract.errors import Gemma4Error
from runtime.settings import GrammarLimits

# A Lark rule or token definition starts a line: `name:`, `?name:`, `!name:`, `NAME.2:` ...
LARK_DEFINITION = re.compile(r"^[ \t]*[?!]?[A-Za-z_][A-Za-z0-9_]*(?:\.-?[0-9]+)?[ \t]*:", re.MULTILINE)
OPENERS, CLOSERS = frozenset("([{"), frozenset(")]}")


class GrammarLimitError(Gemma4Error, ValueError):
    """A grammar over one of our limits (a 400 naming it)."""


def _over(what: str, value: int, limit: int, var: str) -> GrammarLimitError:
    return GrammarLimitError(f"{what} is {value}; at most {limit} is allowed (GEMMA4_GRAMMAR_{var})")


def check_size(text: str, limits: GrammarLimits) -> None:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_bytes:
        raise _over("the grammar's size in bytes", size, limits.max_bytes, "MAX_BYTES")


def check_schema(schema: object, limits: GrammarLimits) -> None:
    """A JSON schema (as Python objects): nesting depth and the number of objects and arrays, walked
    with a stack of our own. The number of nodes also bounds how long a `$ref` chain can be."""
    nodes, todo = 0, [(schema, 1)]
    while todo:
        value, depth = todo.pop()
        if isinstance(value, dict):
            children = list(value.values())
        elif isinstance(value, list):
            children = value
        else:
            continue
        nodes += 1
        if depth > limits.max_depth:
            raise _over("the schema's nesting depth", depth, limits.max_depth, "MAX_DEPTH")
        if nodes > limits.max_nodes:
            raise _over("the schema's number of objects and arrays", nodes, limits.max_nodes, "MAX_NODES")
        todo.extend((child, depth + 1) for child in children)


def check_brackets(text: str, limits: GrammarLimits) -> None:
    """How deep a regex's or a Lark grammar's brackets nest (escaped ones aside; brackets inside
    literals count too, which can only make the figure larger)."""
    depth = deepest = 0
    escaped = False
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch in OPENERS:
            depth += 1
            deepest = max(deepest, depth)
        elif ch in CLOSERS:
            depth = max(0, depth - 1)
    if deepest > limits.max_depth:
        raise _over("the grammar's bracket nesting depth", deepest, limits.max_depth, "MAX_DEPTH")


def check(kind: str, source: str, limits: GrammarLimits) -> None:
    """Every limit that applies to a grammar of this kind (`Grammar.kind`, `Grammar.source`)."""
    check_size(source, limits)
    if kind in ("json_schema", "json_object"):
        check_schema(json.loads(source), limits)
    elif kind == "choice":
        count = len(json.loads(source))
        if count > limits.max_choices:
            raise _over("the number of choices", count, limits.max_choices, "MAX_CHOICES")
    else:  # a regex or a Lark grammar (whose %json blocks are counted as brackets, and as bytes)
        check_brackets(source, limits)
        if kind == "lark":
            rules = len(LARK_DEFINITION.findall(source))
            if rules > limits.max_rules:
                raise _over("the grammar's number of rule and token definitions", rules, limits.max_rules, "MAX_RULES")
