"""Replies in Gemma-4's format split into reasoning, content and tool calls, streamed or whole: a
corpus written from the documented examples, adversarial arguments, and a round-trip property
(JSON arguments -> the chat template's Gemma syntax -> the parser -> the same JSON)."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gemma4_port.source.toy_tokenizer import RESPONSE_SCHEMA, train_tokenizer
from runtime.api.reply_parser import Content, Reasoning, ReplyParser, ToolCall
from runtime.generate.detok import Detokenizer

Q = '<|"|>'
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(1024, 0)


@pytest.fixture(scope="module")
def prompt(tok):
    return tok.apply_chat_template(HI, tokenize=False, add_generation_prompt=True)


def split(tok, prompt, reply, tools=True, by_token=True, **kw):
    """(reasoning, content, [(name, arguments)]) as the parser gives them, fed one token at a time."""
    parser = ReplyParser(tok, prompt, tools, **kw)
    if by_token:  # as the engine streams it: never half a character, special tokens kept
        detok = Detokenizer(tok, skip_special_tokens=False)
        chunks = [detok.push(i) for i in tok(reply, add_special_tokens=False).input_ids] + [detok.flush()]
    else:
        chunks = [reply]
    pieces = [p for c in chunks for p in parser.feed(c)] + parser.finish()
    return (
        "".join(p.text for p in pieces if isinstance(p, Reasoning)),
        "".join(p.text for p in pieces if isinstance(p, Content)),
        [(p.name, json.loads(p.arguments)) for p in pieces if isinstance(p, ToolCall)],
    )


# (reply, reasoning, content, calls): the shapes the documentation shows, then adversarial arguments.
CORPUS = [
    ("The capital of France is Paris.", "", "The capital of France is Paris.", []),
    ("<|channel>thought\nThe user wants a capital.<channel|>Paris.", "The user wants a capital.", "Paris.", []),
    (
        f"<|tool_call>call:get_weather{{location:{Q}Tokyo, JP{Q}}}<tool_call|>",
        "",
        "",
        [("get_weather", {"location": "Tokyo, JP"})],
    ),
    (
        f"<|tool_call>call:write_file{{append:false,content:{Q}hi{Q},path:{Q}a.txt{Q}}}<tool_call|>"
        "<|tool_call>call:get_current_time{}<tool_call|>",
        "",
        "",
        [("write_file", {"append": False, "content": "hi", "path": "a.txt"}), ("get_current_time", {})],
    ),
    (
        f"<|channel>thought\nI need the weather.<channel|><|tool_call>call:get_weather{{city:{Q}Paris{Q}}}<tool_call|>",
        "I need the weather.",
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        f"Let me check.<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:3}}<tool_call|>",
        "",
        "Let me check.",
        [("get_weather", {"city": "Paris", "days": 3})],
    ),
    (
        f"<|tool_call>call:f{{s:{Q}a {{b}} [c] \"d\" 'e' f:g, h\\n{Q}}}<tool_call|>",
        "",
        "",
        [("f", {"s": "a {b} [c] \"d\" 'e' f:g, h\\n"})],
    ),
    (
        f"<|tool_call>call:f{{n:-1.5e-07,i:12345678901234567,z:0,t:true,u:null,e:{Q}{Q}}}<tool_call|>",
        "",
        "",
        [("f", {"n": -1.5e-07, "i": 12345678901234567, "z": 0, "t": True, "u": None, "e": ""})],
    ),
    (
        f"<|tool_call>call:f{{o:{{p:{{q:[1,[2,{Q}x{Q}],{{}}]}}}},l:[],m:{{}}}}<tool_call|>",
        "",
        "",
        [("f", {"o": {"p": {"q": [1, [2, "x"], {}]}}, "l": [], "m": {}})],
    ),
    (
        f"<|tool_call>call:f{{text:{Q}line one\nline two\twith tab, émoji 🙂 and <|channel| lookalike{Q}}}<tool_call|>",
        "",
        "",
        [("f", {"text": "line one\nline two\twith tab, émoji 🙂 and <|channel| lookalike"})],
    ),
]


@pytest.mark.parametrize("reply,reasoning,content,calls", CORPUS)
def test_corpus_splits_streamed_and_whole(tok, prompt, reply, reasoning, content, calls):
    assert split(tok, prompt, reply) == (reasoning, content, calls)
    assert split(tok, prompt, reply, by_token=False) == (reasoning, content, calls)


@pytest.mark.parametrize("reply,reasoning,content,calls", CORPUS)
def test_the_checkpoints_response_schema_agrees(reply, reasoning, content, calls):
    """The real response_schema (regexes over the whole reply) splits the corpus the same way."""
    m = re.fullmatch(RESPONSE_SCHEMA["x-regex"], reply + "<turn|>", re.DOTALL)
    assert (m["thinking"] or "") == reasoning
    if not (content and calls):  # the schema's one regex wants calls before content
        assert (m["content"] or "") == content
    items = RESPONSE_SCHEMA["properties"]["tool_calls"]
    names = [
        re.fullmatch(items["items"]["properties"]["function"]["x-regex"], c, re.DOTALL)["name"]
        for c in re.findall(items["x-regex-iterator"], reply, re.DOTALL)
    ]
    assert names == [name for name, _ in calls]


@pytest.mark.parametrize(
    "reply",
    [
        f"<|tool_call>call:f{{a:{Q}unterminated}}<tool_call|>",
        "<|tool_call>call:f{a:}<tool_call|>",
        "<|tool_call>call:f[1,2]<tool_call|>",
        "<|tool_call>call:f{n:1e999}<tool_call|>",  # JSON has no infinity
    ],
)
def test_a_malformed_call_is_content_not_an_error(tok, prompt, reply):
    reasoning, content, calls = split(tok, prompt, reply)
    assert calls == [] and content.startswith("call:f") and "<|" not in content


def test_keys_of_any_characters_are_read_back_as_the_template_writes_them(tok, prompt):
    """The template writes keys bare whatever they hold; only Gemma's own delimiters cannot be in one."""
    reply = f"<|tool_call>call:f{{user-id:1,a b.c:{{x$:[{Q}k:v,w{Q}]}},é:true}}<tool_call|>"
    assert split(tok, prompt, reply)[2] == [("f", {"user-id": 1, "a b.c": {"x$": ["k:v,w"]}, "é": True})]


def test_special_tokens_never_reach_the_client_unless_asked(tok, prompt):
    reply = "Hello <|image|>world<|turn>"
    assert split(tok, prompt, reply)[1] == "Hello world"
    assert split(tok, prompt, reply, skip_special_tokens=False)[1] == reply


def test_without_tools_a_call_is_content(tok, prompt):
    reply = f"<|tool_call>call:f{{a:{Q}x{Q}}}<tool_call|>"
    assert split(tok, prompt, reply, tools=False) == ("", "call:f{a:x}", [])


def test_the_prompt_sets_the_starting_region():
    large = train_tokenizer(1024, 0, empty_thought_block=True)
    # The larger checkpoints' empty thought block in the prompt: the reply is content.
    prompt = large.apply_chat_template(HI, tokenize=False, add_generation_prompt=True)
    assert split(large, prompt, "Hello.") == ("", "Hello.", [])
    # Thinking after a tool result: the prompt ends at the result, the model's turn goes on, and what it
    # writes in the thought channel is reasoning.
    answered = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": {}}}],
        "tool_responses": [{"name": "f", "response": "ok"}],
    }
    prompt = large.apply_chat_template(
        HI + [answered], tokenize=False, add_generation_prompt=True, enable_thinking=True
    )
    assert prompt.endswith("<tool_response|>")
    assert split(large, prompt, "<|channel>thought\nIt worked.<channel|>Done.") == ("It worked.", "Done.", [])


# JSON the chat template can carry: keys of any characters but Gemma's delimiters (`:,{}[]`), names of
# word characters, no <|"|> inside strings (it is the delimiter), and not the two control characters
# transformers' dialect reserves; no special token's text.
NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,11}", fullmatch=True)
KEYS = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters=":,{}[]\x01\x02"), min_size=1, max_size=12
).filter(lambda s: "<|" not in s and "|>" not in s)
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"), max_size=30).filter(
    lambda s: Q not in s
)
SCALARS = (
    st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.floats(allow_nan=False, allow_infinity=False) | TEXT
)
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4), max_leaves=12
)


@settings(max_examples=150, deadline=None)
@given(args=st.dictionaries(KEYS, VALUES, max_size=5), name=NAMES)
def test_round_trip_json_gemma_json(tok, args, name):
    call = {"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": name, "arguments": args}}]}
    text = tok.apply_chat_template(HI + [call], tokenize=False)
    prefix, reply = text.split("<|turn>model\n")
    reply = reply.removesuffix("\n")  # the model stops at <turn|>; the template goes on to the next line
    assert split(tok, prefix + "<|turn>model\n", reply, by_token=False) == ("", "", [(name, args)])
