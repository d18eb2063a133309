"""Forced tool calls: the grammar writes Gemma's call syntax, and every walk through it (random
tokens among those it allows, as a random model under it would pick) parses back into calls that
validate against the tool's schema: one call of the named function, or of any tool for `required`."""

from __future__ import annotations

import json
import re
import time
from typing import Literal

import jsonschema
import numpy as np
import pytest
from pydantic import BaseModel, Field

from gemma4_port.source.toy_tokenizer import train_tokenizer
from runtime.api.chat import ChatTemplateError
from runtime.api.chat_protocol import Tool
from runtime.api.reply_parser import Reasoning, ReplyParser, ToolCall
from runtime.api.tool_grammar import forced_calls
from runtime.api.tool_names import ToolNames
from runtime.generate.grammar import Grammar, GrammarCompiler
from runtime.settings import GrammarLimits

PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 6},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"},
        "scale": {"type": "number"},
        "detailed": {"type": "boolean"},
        "tags": {
            "type": "array",
            "items": {"type": "string", "minLength": 1, "maxLength": 3},
            "minItems": 1,
            "maxItems": 2,
        },
        "note": {"type": ["string", "null"], "maxLength": 4},
        "where": {
            "type": "object",
            "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
            "required": ["lat", "lon"],
        },
        "mode": {"const": "fast"},
    },
    "required": ["city", "unit"],
}
TOOLS = [
    Tool.model_validate(t)
    for t in (
        {"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}},
        {"type": "function", "function": {"name": "now"}},
        {
            "type": "function",
            "function": {
                "name": "count",
                "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
            },
        },
    )
]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(1024, 0)


@pytest.fixture(scope="module")
def grammars(tok):
    return GrammarCompiler(tok, vocab=1024, eos_ids=[1, *tok.convert_tokens_to_ids(["<turn|>", "<|tool_response>"])])


def walk(tok, grammars, lark: str, seed: int, steps: int = 400, prefer: int | None = None) -> str:
    """Random allowed tokens until an end-of-generation id: any output the grammar permits. `prefer`: a
    token taken one time in four where allowed (to end free text soon)."""
    matcher, rng, out = grammars.matcher(Grammar.lark(lark)), np.random.default_rng(seed), []
    eos = set(grammars_eos(tok))
    for _ in range(steps):
        allowed = matcher.allowed()
        token = prefer if prefer is not None and allowed[prefer] and rng.random() < 0.25 else None
        token = int(rng.choice(np.flatnonzero(allowed))) if token is None else token
        if token in eos:
            return tok.decode(out, skip_special_tokens=False)
        matcher.accept(token)
        out.append(token)
    raise AssertionError(f"no end after {steps} tokens: {tok.decode(out, skip_special_tokens=False)!r}")


def grammars_eos(tok):
    return [1, *tok.convert_tokens_to_ids(["<turn|>", "<|tool_response>"])]


def calls(tok, text: str) -> list[ToolCall]:
    parser = ReplyParser(tok, "", tools=True)
    pieces = parser.feed(text) + parser.finish()
    assert all(isinstance(p, ToolCall) for p in pieces), (text, pieces)
    return pieces


@pytest.mark.parametrize("seed", range(12))
def test_a_named_function_is_called_once_with_valid_arguments(tok, grammars, seed):
    text = walk(tok, grammars, forced_calls(tok, TOOLS, "get_weather", parallel=True), seed)
    assert text.startswith("<|tool_call>call:get_weather{") and text.endswith("<tool_call|>")
    [call] = calls(tok, text)
    jsonschema.validate(json.loads(call.arguments), PARAMS)
    keys = list(json.loads(call.arguments))
    assert keys == sorted(keys, key=str.lower)  # the chat template's order (dictsort): the model's own habit


@pytest.mark.parametrize("seed", range(12))
def test_required_calls_tools_from_the_list(tok, grammars, seed):
    one = calls(tok, walk(tok, grammars, forced_calls(tok, TOOLS, None, parallel=False), seed))
    assert len(one) == 1
    many = calls(tok, walk(tok, grammars, forced_calls(tok, TOOLS, None, parallel=True), seed))
    schemas = {t.function.name: t.function.parameters for t in TOOLS}
    for call in one + many:
        args = json.loads(call.arguments)
        if schemas[call.name] is None:
            assert args == {}
        else:
            jsonschema.validate(args, schemas[call.name])


def test_special_tokens_are_named_by_id(tok):
    lark = forced_calls(tok, TOOLS, "count", parallel=False)
    open_, close = tok.convert_tokens_to_ids(["<|tool_call>", "<tool_call|>"])
    assert f"<[{open_}]>" in lark and f"<[{close}]>" in lark and "<|" not in lark


def test_with_thinking_a_thought_may_come_before_the_call(tok, grammars):
    lark = forced_calls(tok, TOOLS, "now", parallel=False, thinking=True)
    end_of_thought = tok.convert_tokens_to_ids("<channel|>")
    texts = {walk(tok, grammars, lark, seed, prefer=end_of_thought) for seed in range(8)}
    assert "<|tool_call>call:now{}<tool_call|>" in texts
    thought = [t for t in texts if t.startswith("<|channel>thought\n")]
    assert thought and all(t.endswith("<channel|><|tool_call>call:now{}<tool_call|>") for t in thought)
    parser = ReplyParser(tok, "<|turn>model\n", tools=True)
    pieces = parser.feed(thought[0]) + parser.finish()
    assert [p.name for p in pieces if isinstance(p, ToolCall)] == ["now"]
    assert any(isinstance(p, Reasoning) for p in pieces)


# -- schemas as JSON Schema means them -----------------------------------------------------------------
class Inner(BaseModel):
    x: int
    label: Literal["a", "b"] | None = None


class Outer(BaseModel):
    inner: Inner
    many: list[Inner] = Field(default_factory=list, max_length=2)
    kind: Literal["k"] = "k"


class Tree(BaseModel):
    name: str = Field(max_length=3)
    children: list[Tree] = Field(default_factory=list, max_length=2)


SCHEMAS = {
    "pydantic nested models ($ref into $defs)": Outer.model_json_schema(),
    "a recursive model": Tree.model_json_schema(),
    "anyOf, oneOf, type lists, enum, const": {
        "type": "object",
        "properties": {
            "a": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]},
            "b": {"oneOf": [{"const": {"k": [1, "v"]}}, {"type": "null"}]},
            "c": {"type": ["boolean", "array"], "items": {"enum": [1.5, "x", None]}, "maxItems": 2},
            "d": {"type": "object", "additionalProperties": {"type": "integer"}},
        },
        "required": ["a", "b", "c", "d"],
    },
    "keys no word pattern covers": {
        "type": "object",
        "properties": {"file-path": {"type": "string", "maxLength": 4}, "a b.c": {"type": "integer"}},
        "required": ["file-path", "a b.c"],
    },
    "long strings and many items": {
        "type": "object",
        "properties": {
            "s": {"type": "string", "minLength": 80, "maxLength": 100},
            "l": {"type": "array", "items": {"type": "integer"}, "minItems": 40, "maxItems": 50},
        },
        "required": ["s", "l"],
    },
    "numeric ranges": {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": -5, "maximum": 1000000},
            "x": {"type": "number", "exclusiveMinimum": 0, "maximum": 2.5},
            "m": {"type": ["integer", "null"], "minimum": 10},
        },
        "required": ["n", "x", "m"],
    },
    "tuples (prefixItems)": {
        "type": "object",
        "properties": {"t": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "boolean"}]}},
        "required": ["t"],
    },
}


def strict(schema):
    """The schema with undeclared properties refused where it declares some (the grammar's policy)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema:
            out["additionalProperties"] = False
        return out
    return [strict(v) for v in schema] if isinstance(schema, list) else schema


@pytest.mark.parametrize("case", SCHEMAS)
def test_every_call_the_grammar_allows_validates_against_the_schema(tok, grammars, case):
    schema = SCHEMAS[case]
    tool = Tool.model_validate({"type": "function", "function": {"name": "f", "parameters": schema}})
    lark = forced_calls(tok, [tool], "f", parallel=False)
    for seed in range(10):
        [call] = calls(tok, walk(tok, grammars, lark, seed, steps=600))
        jsonschema.validate(json.loads(call.arguments), strict(schema))


def test_an_empty_strict_object_is_called_with_no_arguments(tok, grammars):
    empty = {"type": "object", "properties": {}, "additionalProperties": False}
    tool = Tool.model_validate({"type": "function", "function": {"name": "get_time", "parameters": empty}})
    lark = forced_calls(tok, [tool], None, parallel=False)
    assert {walk(tok, grammars, lark, seed) for seed in range(5)} == {"<|tool_call>call:get_time{}<tool_call|>"}


def test_a_free_form_object_takes_any_keys(tok, grammars):
    """`{"type": "object"}` declares no properties, so it is a map (as structured outputs read it too)."""
    params = {"type": "object", "properties": {"meta": {"type": "object"}}, "required": ["meta"]}
    tool = Tool.model_validate({"type": "function", "function": {"name": "f", "parameters": params}})
    lark = forced_calls(tok, [tool], "f", parallel=False)
    metas = [json.loads(calls(tok, walk(tok, grammars, lark, seed, 800))[0].arguments)["meta"] for seed in range(10)]
    assert any(metas) and all(isinstance(m, dict) for m in metas)


def test_a_hyphenated_tool_is_called_under_an_alias_and_answers_with_its_name(tok, grammars):
    tools = [
        Tool.model_validate({"type": "function", "function": {"name": n, "parameters": PARAMS}})
        for n in ("get-weather", "get_weather")
    ]
    names = ToolNames(t.function.name for t in tools)
    lark = forced_calls(tok, tools, "get-weather", parallel=False, names=names)
    text = walk(tok, grammars, lark, 0)
    assert text.startswith("<|tool_call>call:get_weather_2{") and "get-weather" not in text
    parser = ReplyParser(tok, "", tools=True, names=names)
    [call] = parser.feed(text) + parser.finish()
    assert call.name == "get-weather"
    jsonschema.validate(json.loads(call.arguments), PARAMS)


def nested_types(levels: int, kinds: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": ["object"] * kinds, "properties": {"a": schema}}
    return schema


def test_the_grammar_grows_linearly_with_branching_schemas(tok, grammars):
    """Eight levels of six-way type lists (under a kilobyte of schema) once made a grammar exponential in
    the levels; one rule per schema node keeps it small, and it builds at once."""
    schema = nested_types(8, 6)
    assert len(json.dumps(schema)) < 1000
    tool = Tool.model_validate({"type": "function", "function": {"name": "f", "parameters": schema}})
    start = time.perf_counter()
    lark = forced_calls(tok, [tool], None, parallel=True)
    grammars.compile(Grammar.lark(lark))
    assert time.perf_counter() - start < 1.0
    assert len(lark) < 4000 and lark.count("\n") < 60
    deeper = forced_calls(
        tok,
        [Tool.model_validate({"type": "function", "function": {"name": "f", "parameters": nested_types(16, 6)}})],
        None,
        parallel=True,
    )
    assert len(deeper) < 2.2 * len(lark)  # twice the levels, about twice the grammar


@pytest.mark.parametrize(
    "limits,schema,variable",
    [
        (GrammarLimits(schema_max_depth=8), nested_types(12, 1), "GEMMA4_SCHEMA_MAX_DEPTH"),
        (
            GrammarLimits(schema_max_ref_depth=3),
            {
                "$defs": {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(6)} | {"d6": {"type": "integer"}},
                "type": "object",
                "properties": {"v": {"$ref": "#/$defs/d0"}},
            },
            "GEMMA4_SCHEMA_MAX_REF_DEPTH",
        ),
        (
            GrammarLimits(schema_max_rules=64),
            {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(100)}},
            "GEMMA4_SCHEMA_MAX_RULES",
        ),
    ],
)
def test_schemas_past_a_cap_are_refused_naming_it(tok, limits, schema, variable):
    tool = Tool.model_validate({"type": "function", "function": {"name": "f", "parameters": schema}})
    with pytest.raises(ChatTemplateError, match=variable) as err:
        forced_calls(tok, [tool], None, parallel=False, limits=limits)
    assert err.value.param.startswith("tools") and len(str(err.value)) < 300


@pytest.mark.parametrize(
    "schema,words",
    [
        ({"type": "object", "properties": {"v": {"$ref": "#/$defs/missing"}}}, "points at nothing"),
        ({"type": "object", "properties": {"v": {"$ref": "https://example.com/s.json"}}}, "only references inside"),
        ({"type": "object", "properties": {"a:b": {"type": "integer"}}}, "cannot be written"),
        ({"type": "object", "properties": {"v": {"type": "integr"}}}, "not a JSON Schema type"),
        ({"type": ["string", "boolean"]}, 'must be "object"'),  # arguments are an object
        ({"type": "array"}, 'must be "object"'),
    ],
)
def test_schemas_the_grammar_cannot_follow_are_refused(tok, schema, words):
    tool = Tool.model_validate({"type": "function", "function": {"name": "f", "parameters": schema}})
    with pytest.raises(ChatTemplateError, match=words):
        forced_calls(tok, [tool], None, parallel=False)


def deep_list(levels: int) -> list:
    out: list = [1]
    for _ in range(levels):
        out = [out]
    return out


@pytest.mark.parametrize(
    "schema,variable",
    [
        ({"$ref": "#"}, "GEMMA4_SCHEMA_MAX_REF_DEPTH"),  # a $ref to itself admits nothing: refused, not looped
        (
            {
                "properties": {"a": {"$ref": "#/$defs/A"}},
                "$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}},
            },
            "GEMMA4_SCHEMA_MAX_REF_DEPTH",
        ),
        ({"properties": {"a": {"const": deep_list(200)}}}, "GEMMA4_SCHEMA_MAX_DEPTH"),
        ({"properties": {"k" * 5000: {"properties": {"x:y" * 2000: {}}}}}, "cannot be written"),
    ],
)
def test_hostile_schemas_get_a_short_refusal(tok, schema, variable):
    tool = Tool.model_validate({"type": "function", "function": {"name": "f", "parameters": schema}})
    with pytest.raises(ChatTemplateError, match=variable) as err:
        forced_calls(tok, [tool], None, parallel=False)
    assert len(err.value.param) + len(str(err.value)) < 1024


@pytest.mark.parametrize("seed", range(3))
def test_parameters_listing_types_take_their_object(tok, grammars, seed):
    schema = {"type": ["object", "boolean", "null"], "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    tool = Tool.model_validate({"type": "function", "function": {"name": "f", "parameters": schema}})
    text = walk(tok, grammars, forced_calls(tok, [tool], "f", parallel=False), seed)
    assert re.fullmatch(r"<\|tool_call>call:f\{a:-?[0-9]+\}<tool_call\|>", text), text
