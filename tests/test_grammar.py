"""runtime.generate.grammar: llguidance masks over the test tokenizer; a random "model" under a grammar always
produces output that parses and validates."""

from __future__ import annotations

import contextlib
import json
import random
import time

import jsonschema
import numpy as np
import pytest

from gemma4_port.source.toy_tokenizer import EOS_ID, SPECIAL_TOKENS, TURN_END, train_tokenizer
from runtime.generate.grammar import Grammar, GrammarCompiler, GrammarError
from runtime.generate.grammar_checks import GrammarLimitError
from runtime.generate.logits import Controls, TokenChooser
from runtime.settings import GrammarLimits

VOCAB = 1024
EOS = (EOS_ID, SPECIAL_TOKENS.index(TURN_END))  # the special tokens take the first ids, in order


@pytest.fixture(scope="module")
def tokenizer():
    tok = train_tokenizer(VOCAB, seed=0)
    assert tok.convert_ids_to_tokens(list(EOS)) == ["<eos>", TURN_END]
    return tok


@pytest.fixture(scope="module")
def grammars(tokenizer):
    return GrammarCompiler(tokenizer, VOCAB, EOS)


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """One of a fixed family of JSON schemas whose every instance is short: bounded strings, ranges,
    enums, small arrays, nested objects with all properties required (as OpenAI's strict mode wants)."""
    kinds = ["string", "integer", "number", "boolean", "enum", "null", "pattern"] + (
        ["array", "object"] if depth < 2 else []
    )
    kind = rng.choice(kinds)
    if kind == "string":
        return {"type": "string", "minLength": rng.randint(0, 2), "maxLength": rng.randint(3, 8)}
    if kind == "integer":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 1000)}
    if kind == "number":
        return {"type": "number", "minimum": -10, "maximum": 10}
    if kind == "enum":
        return {
            "enum": rng.sample(["red", "green", "blue", 'a "quoted" one', "{brace}", 7, None, True], rng.randint(1, 4))
        }
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice(["^[0-9]{3}-[0-9]{2}$", "^[a-z]{2,4}$", "^(yes|no)$"])}
    if kind == "array":
        return {
            "type": "array",
            "items": random_schema(rng, depth + 1),
            "minItems": rng.randint(0, 1),
            "maxItems": rng.randint(1, 3),
        }
    if kind == "object":
        props = {f"k{i}_{rng.choice('abc')}": random_schema(rng, depth + 1) for i in range(rng.randint(1, 4))}
        return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}
    return {"type": kind}


def random_model_output(
    grammars: GrammarCompiler, tokenizer, grammar: Grammar, seed: int, steps: int = 300
) -> tuple[str, bool]:
    """What a random-weight model emits under the grammar: seeded logits, masked, sampled at
    temperature 1; (text, ended on an end-of-generation id)."""
    rng = np.random.default_rng(seed)
    matcher, out = grammars.matcher(grammar), []
    for _ in range(steps):
        x = matcher.mask(rng.standard_normal(VOCAB).astype(np.float32) * 3)
        p = np.exp(x - x.max())
        token = int(rng.choice(VOCAB, p=p / p.sum()))
        if token in EOS:
            return tokenizer.decode(out), True
        matcher.accept(token)
        out.append(token)
    return tokenizer.decode(out), False


def test_random_schemas_always_validate(grammars, tokenizer):
    rng = random.Random(1234)
    schemas = [
        {
            "type": "object",
            "properties": (p := {f"f{i}": random_schema(rng) for i in range(rng.randint(1, 4))}),
            "required": list(p),
            "additionalProperties": False,
        }
        for _ in range(40)
    ]
    for i, schema in enumerate(schemas):
        text, ended = random_model_output(grammars, tokenizer, Grammar.json_schema(schema), seed=i)
        assert ended, (schema, text)
        jsonschema.validate(json.loads(text), schema)  # raises on a miss: 100% must validate


def test_json_object_regex_and_choice(grammars, tokenizer):
    for seed in range(5):
        text, ended = random_model_output(grammars, tokenizer, Grammar.regex(r"[0-9]{3}-[a-z]{2}"), seed)
        assert ended and len(text) == 6 and text[:3].isdigit() and text[3] == "-" and text[4:].isalpha()
    options = ["yes", "no", 'a "quoted" {x}']
    seen = {random_model_output(grammars, tokenizer, Grammar.choice(options), seed)[0] for seed in range(30)}
    assert seen <= set(options) and len(seen) > 1
    matcher = grammars.matcher(Grammar.json_object())
    allowed = matcher.allowed()
    assert allowed.shape == (VOCAB,) and list(np.flatnonzero(allowed)) == [tokenizer.convert_tokens_to_ids("{")]
    assert np.array_equal(np.isfinite(matcher.mask(np.zeros(VOCAB, np.float32))), allowed)


def test_eos_is_allowed_only_where_the_grammar_may_stop(grammars, tokenizer):
    matcher = grammars.matcher(Grammar.choice(["yes"]))
    assert not matcher.allowed()[list(EOS)].any()
    for token in tokenizer("yes", add_special_tokens=False).input_ids:
        matcher.accept(token)
    allowed = matcher.allowed()
    assert matcher.finished and set(np.flatnonzero(allowed)) == set(EOS)


def test_rollback_takes_back_drafted_tokens_and_a_chooser_trial_uses_it(grammars, tokenizer):
    """A speculative step drafts under the grammar and takes the drafts back (runtime.generate.logits)."""
    matcher = grammars.matcher(Grammar.choice(["yes", "no"]))
    start = matcher.allowed().copy()
    chooser = TokenChooser(Controls(), [], EOS, matcher)
    with chooser.trial():
        for token in tokenizer("yes", add_special_tokens=False).input_ids:
            chooser.commit(token)
        assert matcher.finished and set(np.flatnonzero(matcher.allowed())) == set(EOS)
    assert not matcher.finished and np.array_equal(matcher.allowed(), start)
    for token in tokenizer("no", add_special_tokens=False).input_ids:
        chooser.commit(token)
    assert matcher.finished


def test_lark_reaches_special_tokens_and_forks(grammars, tokenizer):
    """A forced tool call is Gemma's own syntax, its special tokens included, through a Lark grammar."""
    call, quote, end = tokenizer.convert_tokens_to_ids(["<|tool_call>", '<|"|>', "<tool_call|>"])
    matcher = grammars.matcher(Grammar.lark('start: <|tool_call> "call:f{a:" <|"|> "x" <|"|> "}" <tool_call|>'))
    assert list(np.flatnonzero(matcher.allowed())) == [call]
    matcher.accept(call)
    for token in tokenizer("call:f{a:", add_special_tokens=False).input_ids:
        matcher.accept(token)
    twin = matcher.fork()
    assert list(np.flatnonzero(matcher.allowed())) == [quote]
    matcher.accept(quote)
    assert list(np.flatnonzero(twin.allowed())) == [quote]  # the fork did not move
    with pytest.raises(GrammarError, match="not allowed"):
        twin.accept(end)


@pytest.mark.parametrize(
    "grammar,match",
    [
        (Grammar.lark("start: nope"), "unknown name"),
        (Grammar.json_schema({"type": "wat"}), "wat"),
        (Grammar.regex("(unclosed"), "unclosed group"),
    ],
)
def test_a_bad_grammar_is_one_error(grammars, grammar, match):
    with pytest.raises(GrammarError, match=match) as info:
        grammars.compile(grammar)
    assert "\n" not in str(info.value)


def test_choice_needs_strings():
    with pytest.raises(GrammarError, match="non-empty list"):
        Grammar.choice([])


def lark_chain(rules: int) -> Grammar:
    """start -> r0 -> r1 -> ... -> "a": each rule one level deeper in llguidance's native recursion."""
    return Grammar.lark("start: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(rules)) + f'r{rules}: "a"')


def ref_chain(defs: int) -> Grammar:
    """A schema whose `$ref`s chain `defs` definitions deep, each an anyOf (the costliest shape)."""
    chain = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"type": "null"}]} for i in range(defs)}
    return Grammar.json_schema({"$ref": "#/$defs/d0", "$defs": chain | {f"d{defs}": {"type": "string"}}})


def nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize(
    "grammar, limit",
    [
        (lark_chain(10_000), "GEMMA4_GRAMMAR_MAX_BYTES"),  # 128 KB: it overflowed the native stack
        (lark_chain(1_500), "GEMMA4_GRAMMAR_MAX_RULES"),
        (ref_chain(1_500), "GEMMA4_GRAMMAR_MAX_BYTES"),
        (ref_chain(400), "GEMMA4_GRAMMAR_MAX_NODES"),
        (Grammar.json_schema(nested(200)), "GEMMA4_GRAMMAR_MAX_DEPTH"),
        (Grammar.regex("(" * 100 + "a" + ")" * 100), "GEMMA4_GRAMMAR_MAX_DEPTH"),
        (Grammar.choice([f"option {i}" for i in range(2_000)]), "GEMMA4_GRAMMAR_MAX_CHOICES"),
    ],
)
def test_grammars_over_a_limit_are_refused_before_llguidance_sees_them(tokenizer, grammar, limit):
    compiler = GrammarCompiler(tokenizer, VOCAB, EOS, GrammarLimits(max_nodes=1_000))
    with pytest.raises(GrammarLimitError, match=limit) as info:
        compiler.compile(grammar)
    assert len(str(info.value)) < 200 and "r1:" not in str(info.value) and "$defs" not in str(info.value)


def test_a_schema_deeper_than_python_recursion_is_refused_not_a_crash():
    with pytest.raises(GrammarLimitError, match="nests deeper"):
        Grammar.json_schema(nested(100_000))


def test_grammars_that_overflowed_the_default_stack_compile_on_the_compile_threads(tokenizer):
    """With our limits raised past them, what killed the process on an 8 MB stack compiles (a 256 MB one)."""
    raised = GrammarLimits(max_bytes=1 << 20, max_rules=20_000, max_nodes=100_000)
    compiler = GrammarCompiler(tokenizer, VOCAB, EOS, raised)
    for grammar in (lark_chain(10_000), ref_chain(1_500)):
        assert not compiler.compile(grammar).finished


def test_a_grammar_slow_to_start_is_bounded_by_llguidances_fuel(grammars):
    """`a{1000}{1000}` took 6-7 s of the engine thread at its first mask with llguidance's default fuel."""
    start = time.perf_counter()
    with contextlib.suppress(GrammarError):
        grammars.compile(Grammar.regex("a{1000}{1000}"))
    assert time.perf_counter() - start < 3.0


def test_a_compile_that_misses_its_deadline_is_a_grammar_error(tokenizer):
    compiler = GrammarCompiler(tokenizer, VOCAB, EOS, GrammarLimits(compile_timeout_s=0.001, max_choices=1_000))
    with pytest.raises(GrammarError, match="GEMMA4_GRAMMAR_COMPILE_TIMEOUT_S"):
        compiler.compile(Grammar.choice([f"option number {i}" for i in range(1_000)]))


def test_llguidances_messages_are_short_and_terse(grammars):
    rules = "".join(f'rule{i}: "{"x" * 50}"\n' for i in range(200))
    with pytest.raises(GrammarError) as info:
        grammars.compile(Grammar.lark(rules + "start: missing_rule"))
    assert len(str(info.value)) <= 300 and "x" * 50 not in str(info.value)


# -- undeclared properties (the policy xgrammar compiles by default) ---------------------------------------
def test_objects_that_declare_properties_take_no_others_unless_they_say_so():
    schema = {
        "type": "object",
        "properties": {
            "inner": {"$ref": "#/$defs/Inner"},
            "free": {"type": "object"},  # declares none: a map, as before
            "open": {"type": "object", "properties": {"a": {}}, "additionalProperties": True},
            "typed": {"type": "object", "properties": {}, "additionalProperties": {"type": "integer"}},
            "list": {"type": "array", "items": {"properties": {"b": {"type": "integer"}}}},
            "either": {"anyOf": [{"properties": {"c": {}}}, {"type": "null"}]},
            "both": {"allOf": [{"properties": {"d": {}}}, {"properties": {"e": {}}}]},
            "value": {"const": {"properties": {"x": 1}}},  # data, not a schema
        },
        "$defs": {"Inner": {"properties": {"x": {"type": "integer"}}, "unevaluatedProperties": {"type": "string"}}},
    }
    out = json.loads(Grammar.json_schema(schema).source)
    props = out["properties"]
    assert out["additionalProperties"] is False
    assert "additionalProperties" not in props["free"]
    assert props["open"]["additionalProperties"] is True and props["typed"]["additionalProperties"] == {
        "type": "integer"
    }
    assert props["list"]["items"]["additionalProperties"] is False
    assert props["either"]["anyOf"][0]["additionalProperties"] is False
    assert all("additionalProperties" not in member for member in props["both"]["allOf"])
    assert props["value"] == schema["properties"]["value"]
    assert "additionalProperties" not in out["$defs"]["Inner"]  # unevaluatedProperties already says
    assert "additionalProperties" not in schema  # the client's schema is left as it came


def test_a_schema_without_additional_properties_ends_after_its_last_field(grammars, tokenizer):
    """Agent libraries send pydantic's schemas as they are (no additionalProperties); a sampled output
    still closes the object after the declared fields instead of inventing more."""
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    for seed in range(20):
        text, ended = random_model_output(grammars, tokenizer, Grammar.json_schema(schema), seed)
        assert ended and list(json.loads(text)) == ["name", "age"], text
