"""runtime.generate.lookup: prompt lookup drafts what followed the longest recent match of the context's
tail, and the context buffer that grows with a choice."""

from __future__ import annotations

import numpy as np

from runtime.generate.lookup import Context, propose


def ids(text: str) -> np.ndarray:
    return np.array([ord(ch) for ch in text], dtype=np.int64)


def text(tokens: list[int]) -> str:
    return "".join(chr(t) for t in tokens)


def test_the_longest_suffix_that_occurred_before_gives_what_followed_it():
    # "cd" occurred twice: "bcd" (3 tokens) only once, followed by "efg"
    assert text(propose(ids("abcdefg xcd zz bcd"), 3, 1, 3)) == "efg"
    # max_n 2: the latest "cd" followed by 3 tokens is " zz"
    assert text(propose(ids("abcdefg xcd zz bcd"), 3, 1, 2)) == " zz"
    assert text(propose(ids("abcdefg xcd zz bcd"), 2, 2, 2)) == " z"


def test_no_match_no_draft_and_min_n_is_honoured():
    assert propose(ids("abcdefg"), 4, 1, 3) == []
    assert propose(ids("abcxa"), 4, 2, 3) == []  # only a 1-token match ("a")
    assert text(propose(ids("abcxa"), 4, 1, 3)) == "bcxa"
    assert propose(ids("abcab"), 0, 1, 3) == []
    assert propose(ids("a"), 3, 1, 3) == []


def test_a_repeating_tail_drafts_k_tokens_not_one():
    # The latest "aa" is followed by one token only; an earlier one by k tokens.
    assert text(propose(ids("aaaaaaa"), 4, 2, 2)) == "aaaa"
    # A cycle: the latest occurrence followed by k tokens.
    assert text(propose(ids("xyz abc abc abc ab"), 4, 1, 3)) == "c ab"


def test_an_edit_request_drafts_its_input_back():
    source = "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n"
    prompt = "Rename add to plus:\n" + source + "\nAnswer:\n"
    out = "def plus(a, b):\n    return"
    assert text(propose(ids(prompt + out), 8, 2, 4)) == " a + b\n\n"


def test_the_context_grows_past_its_first_buffer():
    c = Context(range(10))
    for t in range(10, 300):
        c.append(t)
    assert c.tokens.tolist() == list(range(300)) and c.size == 300
    assert Context().tokens.tolist() == []
