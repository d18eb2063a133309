"""The random test models speak Gemma-4's chat protocol: its control tokens, a chat template whose
renderings match the documented examples, the real response_schema, and end-of-generation ids."""

from __future__ import annotations

import json
import re

import pytest
from jinja2 import TemplateError

from gemma4_port.source.checkpoint import resolve_checkpoint
from gemma4_port.source.manifest import load_manifest
from gemma4_port.source.toy_tokenizer import RESPONSE_SCHEMA, SPECIAL_TOKENS, train_tokenizer
from support import MANIFESTS

Q = '<|"|>'
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city"}},
            "required": ["city"],
        },
    },
}
DECLARATION = (
    f"<|tool>declaration:get_weather{{description:{Q}Get the weather{Q},parameters:{{properties:{{"
    f"city:{{description:{Q}The city{Q},type:{Q}STRING{Q}}}}},required:[{Q}city{Q}],type:{Q}OBJECT{Q}}}}}<tool|>"
)
CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    ],
}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}
ASK = {"role": "user", "content": "Weather in Paris?"}


@pytest.fixture(scope="module")
def small():
    """E2B/E4B style: a non-thinking model turn opens bare."""
    return train_tokenizer(1024, 0)


@pytest.fixture(scope="module")
def large():
    """The larger checkpoints' style: an empty thought block when thinking is off."""
    return train_tokenizer(1024, 0, empty_thought_block=True)


def render(tok, messages, **kw):
    return tok.apply_chat_template(messages, tokenize=False, **{"add_generation_prompt": True} | kw)


def test_control_tokens_are_special_and_never_split(small):
    specials = {t.content: i for i, t in small.added_tokens_decoder.items() if t.special}
    assert set(SPECIAL_TOKENS) <= specials.keys()
    assert [small.pad_token_id, small.eos_token_id, small.bos_token_id, small.unk_token_id] == [0, 1, 2, 3]
    for token in SPECIAL_TOKENS:
        ids = small(f"a{token}b", add_special_tokens=False).input_ids
        assert specials[token] in ids and len(ids) == 3, (token, ids)
    assert small.eot_token == "<turn|>" and small.escape_token == Q and small.stc_token == "<|tool_call>"


@pytest.mark.parametrize(
    "messages,kw,expected",
    [
        (
            [{"role": "user", "content": "Capital of France?"}],
            {},
            "<bos><|turn>user\nCapital of France?<turn|>\n<|turn>model\n",
        ),
        (
            [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi"}],
            {},
            "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n",
        ),
        (
            [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            {"enable_thinking": True},
            "<bos><|turn>system\n<|think|>\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n",
        ),
        (
            [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "Bye"},
            ],
            {},
            "<bos><|turn>user\nHi<turn|>\n<|turn>model\nHello!<turn|>\n<|turn>user\nBye<turn|>\n<|turn>model\n",
        ),
        (
            [ASK],
            {"tools": [WEATHER]},
            f"<bos><|turn>system\n{DECLARATION}<turn|>\n<|turn>user\nWeather in Paris?<turn|>\n<|turn>model\n",
        ),
    ],
)
def test_template_renders_the_documented_turns(small, messages, kw, expected):
    assert render(small, messages, **kw) == expected


def test_tool_call_and_result_continue_one_model_turn(small):
    head = f"<bos><|turn>system\n{DECLARATION}<turn|>\n<|turn>user\nWeather in Paris?<turn|>\n<|turn>model\n"
    call = f"<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}<tool_call|>"
    # The call alone: the turn ends where the model stopped, at <|tool_response>.
    assert render(small, [ASK, CALL], tools=[WEATHER], add_generation_prompt=False) == head + call + "<|tool_response>"
    # With its result the model continues the same turn: no new <|turn>model.
    result = f"<|tool_response>response:get_weather{{value:{Q}sunny, 21 C{Q}}}<tool_response|>"
    assert render(small, [ASK, CALL, RESULT], tools=[WEATHER]) == head + call + result
    # With thinking on, the generation prompt opens the thought channel after the result.
    thinking = render(small, [ASK, CALL, RESULT], tools=[WEATHER], enable_thinking=True)
    assert thinking.endswith(result + "<|channel>thought\n") and "<|think|>\n" in thinking
    # The answer closes the turn; the next user turn starts a new one.
    later = render(
        small,
        [ASK, CALL, RESULT, {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Thanks"}],
        tools=[WEATHER],
    )
    assert later == head + call + result + "Sunny.<turn|>\n<|turn>user\nThanks<turn|>\n<|turn>model\n"


def test_parallel_calls_results_matched_by_id(small):
    calls = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": {"n": 1, "on": True, "x": None}}},
            {"id": "b", "type": "function", "function": {"name": "g", "arguments": {"l": [1.5, "s"], "o": {"k": "v"}}}},
        ],
    }
    text = render(
        small,
        [
            ASK,
            calls,
            {"role": "tool", "tool_call_id": "b", "content": "two"},
            {"role": "tool", "tool_call_id": "a", "content": "one"},
        ],
    )
    assert text.endswith(
        "<|turn>model\n<|tool_call>call:f{n:1,on:true,x:null}<tool_call|>"
        f"<|tool_call>call:g{{l:[1.5,{Q}s{Q}],o:{{k:{Q}v{Q}}}}}<tool_call|>"
        f"<|tool_response>response:g{{value:{Q}two{Q}}}<tool_response|>"
        f"<|tool_response>response:f{{value:{Q}one{Q}}}<tool_response|>"
    )


def test_thoughts_are_replayed_only_after_the_last_user_turn(small):
    old = {"role": "assistant", "content": "A", "reasoning_content": "old thought"}
    new = {"role": "assistant", "content": "B", "reasoning_content": "new thought"}
    text = render(small, [ASK, old, {"role": "user", "content": "again"}, new], add_generation_prompt=False)
    assert "old thought" not in text and "<|channel>thought\nnew thought\n<channel|>B<turn|>\n" in text
    # Thoughts left inside content are never replayed either.
    stripped = render(
        small,
        [ASK, {"role": "assistant", "content": "<|channel>thought\nhmm<channel|>Paris."}],
        add_generation_prompt=False,
    )
    assert stripped.endswith("<|turn>model\nParis.<turn|>\n")


def test_the_empty_thought_block_follows_each_checkpoints_template(small, large):
    hi = [{"role": "user", "content": "Hi"}]
    assert render(small, hi).endswith("<|turn>model\n")
    assert render(large, hi).endswith("<|turn>model\n<|channel>thought\n<channel|>")
    assert render(large, hi, enable_thinking=True).endswith("<|turn>model\n")


def test_arguments_must_be_an_object_not_json_text(small):
    bad = {"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": '{"n": 1}'}}]}
    with pytest.raises(TemplateError, match="must be a JSON object"):
        render(small, [ASK, bad])


@pytest.mark.parametrize("name,empty_block", [("tiny-e2b", False), ("tiny-12b", True)])
def test_random_checkpoint_carries_the_protocol(name, empty_block):
    folder = resolve_checkpoint(load_manifest(MANIFESTS / f"{name}.yaml"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["response_schema"] == RESPONSE_SCHEMA and config["eot_token"] == "<turn|>"
    vocab = json.loads((folder / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in vocab["added_tokens"] if t["special"]}
    eos = json.loads((folder / "generation_config.json").read_text())["eos_token_id"]
    assert eos == [ids["<eos>"], ids["<turn|>"], ids["<|tool_response>"]]
    template = (folder / "chat_template.jinja").read_text()
    assert re.search(r"set empty_thought_block = (\w+)", template)[1] == str(empty_block).lower()
