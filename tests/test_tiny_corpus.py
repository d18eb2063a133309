"""The tiny chat model's corpus: seeded, in the server's own template, held-out prompts kept apart."""

import re

import pytest

from gemma4_port.source import tiny_corpus
from gemma4_port.source.toy_tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(1024, 0)


def test_the_same_seed_gives_the_same_conversations_and_another_seed_others():
    assert tiny_corpus.conversations(0, 50) == tiny_corpus.conversations(0, 50)
    assert tiny_corpus.conversations(0, 50) != tiny_corpus.conversations(1, 50)
    assert tiny_corpus.edits(0, 5) == tiny_corpus.edits(0, 5)


def test_conversations_are_rendered_by_the_chat_template_with_tools_calls_and_results(tok):
    convs = tiny_corpus.conversations(0, 200)
    texts = [tiny_corpus.render(tok, c) for c in convs]
    assert all(t.startswith("<bos>") and t.rstrip().endswith("<turn|>") for t in texts)
    called = [t for t, c in zip(texts, convs, strict=True) if c.tools]
    assert called and all("<|tool>declaration:get_weather" in t for t in called)
    assert all("<|tool_call>call:get_weather{" in t for t in called)
    assert any("<|tool_response>response:get_weather{" in t for t in called)
    # The served prompt is the conversation's text up to the answer, as the server renders it.
    for conv, text in zip(convs[:20], texts, strict=False):
        assert text.startswith(tiny_corpus.render_prompt(tok, conv))


def test_facts_and_sums_are_right():
    for conv in tiny_corpus.conversations(3, 300):
        for q, a in zip(conv.messages, conv.messages[1:], strict=False):
            if q["role"] != "user" or not a.get("content"):
                continue
            if m := re.fullmatch(r"(\d+) \+ (\d+) = (\d+)\.", a["content"]):
                assert int(m[1]) + int(m[2]) == int(m[3])
            if m := re.fullmatch(r"The capital of (.+) is (.+)\.", a["content"]):
                assert tiny_corpus.CAPITALS[m[1]] == m[2] and m[1] in q["content"]


def test_an_edit_answer_is_its_code_with_one_parameter_renamed():
    for conv in tiny_corpus.edits(0, 20):
        request, answer = conv.messages[0]["content"], conv.messages[1]["content"]
        old, new, code = re.fullmatch(r"Rename (\w+) to (\w+) in this code:\n(.*)", request, re.S).groups()
        assert re.search(rf"\b{old}\b", code) and not re.search(rf"\b{old}\b", answer)
        assert answer == re.sub(rf"\b{old}\b", new, code)


def test_held_out_prompts_never_occur_in_training_and_held_out_code_is_other_files(tok):
    training = tiny_corpus.conversations(0, 500)
    held = tiny_corpus.held_out(1, 30, training, tok)
    seen = {tiny_corpus.render_prompt(tok, c) for c in training}
    assert len(held) == 30 and not seen & {tiny_corpus.render_prompt(tok, c) for c in held}
    trained_code = "\n".join(tiny_corpus.stdlib_sources())
    assert not set(tiny_corpus.STDLIB_FILES) & set(tiny_corpus.HELD_OUT_STDLIB)
    for fn in tiny_corpus.functions(tiny_corpus.stdlib_sources(tiny_corpus.HELD_OUT_STDLIB)):
        assert fn not in trained_code
