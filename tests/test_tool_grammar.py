"""Forced tool calls: the grammar writes Gemma's call syntax, and every walk through it (random
tokens among those it allows, as a random model under it would pick) parses back into calls that
validate against the tool's schema: one call of the named function, or of any tool for `required`."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from gemma4_port.source.toy_tokenizer import train_tokenizer
from runtime.api.chat import Tool
from runtime.api.reply_parser import ReplyParser, ToolCall
from runtime.api.tool_grammar import forced_calls
from runtime.generate.grammar import Grammar, GrammarCompiler

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


def walk(tok, grammars, lark: str, seed: int, steps: int = 400) -> str:
    """Random allowed tokens until an end-of-generation id: any output the grammar permits."""
    matcher, rng, out = grammars.matcher(Grammar.lark(lark)), np.random.default_rng(seed), []
    eos = set(grammars_eos(tok))
    for _ in range(steps):
        token = int(rng.choice(np.flatnonzero(matcher.allowed())))
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


def test_a_call_after_an_open_thought_closes_it_first(tok, grammars):
    lark = forced_calls(tok, TOOLS, "now", parallel=False, thought_open=True)
    text = walk(tok, grammars, lark, 0)
    assert text == "<channel|><|tool_call>call:now{}<tool_call|>"
    prompt = "<|turn>model\n<|tool_response>response:x{value:1}<tool_response|><|channel>thought\n"
    parser = ReplyParser(tok, prompt, tools=True)
    assert [p.name for p in parser.feed(text) + parser.finish()] == ["now"]
