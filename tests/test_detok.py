"""Incremental detokenization and stop strings, token by token, with a real byte-level BPE."""

from __future__ import annotations

import pytest

from gemma4_port.source.toy_tokenizer import train_tokenizer
from runtime.generate.detok import Detokenizer, TextStream, stop_prefix_len

REPLACEMENT = "\ufffd"  # what a decoder shows for an incomplete UTF-8 character
MULTIBYTE = "naïve café: Ωμέγα ✓ 日本語 🙂🚀 𝔘𝔫𝔦 done"


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(vocab_size=1024, seed=0)


def ids_of(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False).input_ids


def test_utf8_characters_are_never_split(tok):
    ids = ids_of(tok, MULTIBYTE)
    # The premise: this tokenizer really spreads characters over several tokens.
    assert sum(REPLACEMENT in tok.decode([i]) for i in ids) >= 10
    detok = Detokenizer(tok)
    pieces = [detok.push(i) for i in ids]
    assert not any(REPLACEMENT in p for p in pieces)
    assert "".join(pieces) + detok.flush() == MULTIBYTE
    assert "" in pieces  # some tokens released nothing: they ended inside a character


def test_flush_releases_an_incomplete_character_at_the_end(tok):
    ids = ids_of(tok, "ok 🙂")[:-1]  # the emoji's last byte never comes
    detok = Detokenizer(tok)
    released = "".join(detok.push(i) for i in ids)
    assert released == "ok "
    assert detok.flush().startswith(REPLACEMENT)


def test_special_tokens_add_no_text_unless_kept(tok):
    ids = ids_of(tok, "hello") + [tok.convert_tokens_to_ids("<turn|>")] + ids_of(tok, " world")
    detok = Detokenizer(tok)
    assert "".join(detok.push(i) for i in ids) + detok.flush() == "hello world"
    kept = Detokenizer(tok, skip_special_tokens=False)
    assert "".join(kept.push(i) for i in ids) + kept.flush() == "hello<turn|> world"


def stream(tok, text: str, stops, min_tokens: int = 0) -> tuple[list[str], bool]:
    s = TextStream(tok, stops, min_tokens=min_tokens)
    pieces = []
    for i in ids_of(tok, text):
        pieces.append(s.push(i))
        if s.stopped:
            return pieces, True
    pieces.append(s.flush())
    return pieces, False


def test_stop_string_ends_the_stream_and_is_never_shown(tok):
    pieces, stopped = stream(tok, "The capital of France is Paris. The capital", ["Paris"])
    assert stopped and "".join(pieces) == "The capital of France is "
    assert not any("P" in p for p in pieces)  # not even its first letter went out


def test_a_held_back_prefix_is_released_when_no_stop_follows(tok):
    pieces, stopped = stream(tok, "Par Parrot Pa", ["Paris"])
    assert not stopped and "".join(pieces) == "Par Parrot Pa"
    assert pieces[-1].endswith("Pa")  # held until the end: it could still have become "Paris"


def test_earliest_of_several_stops_wins_and_multibyte_stops_work(tok):
    pieces, stopped = stream(tok, "Ωμέγα ✓ 日本語", ["日本", "✓"])
    assert stopped and "".join(pieces) == "Ωμέγα "


def test_stop_prefix_len():
    assert stop_prefix_len("abc Pa", ["Paris"]) == 2
    assert stop_prefix_len("abc Pa", ["Paris", "c Pal"]) == 4
    assert stop_prefix_len("abc", ["xyz"]) == 0
    assert stop_prefix_len("xPari", ["Paris"]) == 4
    assert stop_prefix_len("", ["Paris"]) == 0


def test_no_stop_string_counts_within_min_tokens(tok):
    """vLLM's rule: a stop string counts only if it ends in the text of a token past min_tokens (it
    may begin before), checked here against every min_tokens over a text with a stop in many places."""
    text, stops = "ab ab, ab; xab abab.", ["ab"]
    ids = ids_of(tok, text)
    assert len(ids) > 6  # the premise: many tokens, so the boundary falls in many places
    for m in range(len(ids) + 1):
        before = len(tok.decode(ids[:m]))  # the text of the first m tokens
        at = text.find("ab", max(0, before - len("ab") + 1))
        pieces, stopped = stream(tok, text, stops, min_tokens=m)
        assert stopped == (at >= 0) and "".join(pieces) == (text[:at] if at >= 0 else text), m


def test_a_stop_string_may_begin_inside_min_tokens(tok):
    word = "Ωμέγα"
    ids = ids_of(tok, word)
    pieces, stopped = stream(tok, "ok " + word, [word], min_tokens=len(ids_of(tok, "ok ")) + 1)
    assert len(ids) > 2 and stopped and "".join(pieces) == "ok "
    pieces, stopped = stream(tok, "ok " + word, [word], min_tokens=len(ids_of(tok, "ok " + word)))
    assert not stopped and "".join(pieces) == "ok " + word
