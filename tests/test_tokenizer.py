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
from support import GOLDEN, MANIFESTS

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
            "<bos><|turn>system\n<|think|>Be brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n",
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
    """Messages as the server hands them over: results on the model's message (`tool_responses`)."""
    head = f"<bos><|turn>system\n{DECLARATION}<turn|>\n<|turn>user\nWeather in Paris?<turn|>\n<|turn>model\n"
    call = f"<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}<tool_call|>"
    # The call alone closes the turn, as the checkpoints' template does.
    assert render(small, [ASK, CALL], tools=[WEATHER], add_generation_prompt=False) == head + call + "<turn|>\n"
    # With its result and no answer the turn stays open, and the generation prompt continues it.
    answered = CALL | {"tool_responses": [{"name": "get_weather", "response": "sunny, 21 C"}]}
    result = f"<|tool_response>response:get_weather{{value:{Q}sunny, 21 C{Q}}}<tool_response|>"
    assert render(small, [ASK, answered], tools=[WEATHER]) == head + call + result
    assert render(small, [ASK, answered], tools=[WEATHER], enable_thinking=True).endswith(result)
    # The answer closes the turn; the next user turn starts a new one.
    later = render(
        small, [ASK, answered | {"content": "Sunny."}, {"role": "user", "content": "Thanks"}], tools=[WEATHER]
    )
    assert later == head + call + result + "Sunny.<turn|>\n<|turn>user\nThanks<turn|>\n<|turn>model\n"


def test_parallel_calls_and_their_results(small):
    calls = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": {"n": 1, "on": True, "x": None}}},
            {"id": "b", "type": "function", "function": {"name": "g", "arguments": {"l": [1.5, "s"], "o": {"k": "v"}}}},
        ],
        "tool_responses": [{"name": "g", "response": "two"}, {"name": "f", "response": {"n": 1}}],
    }
    assert render(small, [ASK, calls]).endswith(
        "<|turn>model\n<|tool_call>call:f{n:1,on:true,x:null}<tool_call|>"
        f"<|tool_call>call:g{{l:[1.5,{Q}s{Q}],o:{{k:{Q}v{Q}}}}}<tool_call|>"
        f"<|tool_response>response:g{{value:{Q}two{Q}}}<tool_response|>"
        "<|tool_response>response:f{n:1}<tool_response|>"
    )


def test_thoughts_are_never_replayed(small):
    """As in the checkpoints' template: reasoning_content is not rendered, thought blocks left inside
    a model message's content are cut."""
    new = {"role": "assistant", "content": "B", "reasoning_content": "new thought"}
    text = render(small, [ASK, new], add_generation_prompt=False)
    assert "new thought" not in text and text.endswith("<|turn>model\nB<turn|>\n")
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


# -- the test template against the checkpoints' own, on every conversation shape ------------------------
def openai_call(id_: str, name: str, args: dict) -> dict:
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


USER, BYE = {"role": "user", "content": " Weather in Paris? "}, {"role": "user", "content": "Thanks"}
CALLS = {"role": "assistant", "content": None, "tool_calls": [openai_call("c1", "get-weather", {"city": "Paris"})]}
TWO_CALLS = CALLS | {
    "tool_calls": [*CALLS["tool_calls"], openai_call("c2", "now", {"tz": {"name": "CET"}, "n": [1.5]})]
}
RESULT_1 = {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 C"}
RESULT_2 = {"role": "tool", "tool_call_id": "c2", "content": '{"time": "12:00", "ok": true}'}
ANSWER = {"role": "assistant", "content": "<|channel>thought\nhmm<channel|>Sunny.", "reasoning_content": "it is"}
CONVERSATIONS = {
    "one user turn": [USER],
    "system and user": [{"role": "system", "content": " Be brief. "}, USER],
    "an exchange": [USER, {"role": "assistant", "content": "Hello!"}, BYE],
    "a call without its result": [USER, CALLS],
    "a result awaiting the answer": [USER, CALLS, RESULT_1],
    "parallel calls, results out of order": [USER, TWO_CALLS, RESULT_2, RESULT_1],
    "an answer after the results": [USER, TWO_CALLS, RESULT_1, RESULT_2, ANSWER, BYE],
    "an answer ending the history": [USER, CALLS, RESULT_1, ANSWER],
    "an image and a clip": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": " What is this? "},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "text", "text": "And this:"},
                {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
            ],
        },
        {"role": "assistant", "content": "A cat."},
        BYE,
    ],
    "two rounds of calls": [
        USER,
        CALLS,
        RESULT_1,
        CALLS | {"tool_calls": [openai_call("c3", "now", {})]},
        RESULT_2 | {"tool_call_id": "c3"},
        ANSWER,
        BYE,
    ],
}


@pytest.fixture(scope="module")
def reference():
    return (GOLDEN / "templates" / "gemma4_conversation.jinja").read_text()


@pytest.mark.parametrize("shape", CONVERSATIONS)
@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("generation", [True, False])
def test_conversations_render_as_the_checkpoints_template_does(small, large, reference, shape, thinking, generation):
    """OpenAI's messages, converted as the server converts them, render identically with the test
    template and the checkpoints' own (the larger checkpoints' generation prompt; E2B/E4B's differs
    only by leaving out the empty thought block there)."""
    from runtime.api.chat import template_messages, tool_names
    from runtime.api.chat_protocol import Message

    messages = [Message.model_validate(m) for m in CONVERSATIONS[shape]]
    converted = template_messages(messages, tool_names(None, messages))
    kw = {"add_generation_prompt": generation, "enable_thinking": thinking}
    real = large.apply_chat_template(converted, tokenize=False, chat_template=reference, **kw)
    assert render(large, converted, **kw) == real
    empty_block = "<|channel>thought\n<channel|>"
    assert render(small, converted, **kw) == real.removesuffix(empty_block if generation and not thinking else "")


@pytest.mark.parametrize("generation", [True, False])
def test_media_parts_render_as_the_checkpoints_template_renders_them(small, large, reference, generation):
    """A user message of text, image and audio parts (as the server hands them to the template): the
    placeholders where the parts are, the text parts trimmed, exactly as the checkpoints' template."""
    parts = [
        {"type": "text", "text": " What is this? "},
        {"type": "image"},
        {"type": "text", "text": "And this:"},
        {"type": "audio"},
    ]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": parts}]
    kw = {"add_generation_prompt": generation}
    real = large.apply_chat_template(messages, tokenize=False, chat_template=reference, **kw)
    assert "What is this?\n\n<|image|>\n\nAnd this:<|audio|><turn|>" in real
    assert render(large, messages, **kw) == real
    empty_block = "<|channel>thought\n<channel|>"
    assert render(small, messages, **kw) == real.removesuffix(empty_block if generation else "")


def test_a_real_vocabulary_trains_the_corpus_and_fills_the_rest_with_unused_ids():
    """A random model of a real checkpoint's shapes (doctor's stand-ins) gets the whole 262,144 ids."""
    from gemma4_port.source.toy_tokenizer import TRAINED_MAX

    real = train_tokenizer(262_144, 0)
    assert len(real) == 262_144
    ids = real("Capital of France? The sea, the sea. <|turn>user")["input_ids"]
    assert len(ids) > 5 and max(ids) < TRAINED_MAX  # no merge reaches the filler
    assert real.convert_ids_to_tokens(262_143) == "<unused262143>"
    assert real.decode([TRAINED_MAX]) == f"<unused{TRAINED_MAX}>"
