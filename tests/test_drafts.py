"""runtime.generate.drafts: how many tokens a choice may verify (never past max_tokens, never writing
past kv_max), and prompt lookup's draft cut at an end id."""

from __future__ import annotations

from runtime.generate.drafts import lookup_draft, room
from runtime.generate.logits import Controls, TokenChooser
from runtime.generate.lookup import Context


def test_room_is_bounded_by_k_max_tokens_and_kv_max():
    assert room(4, generated=1, max_tokens=100, position=10, kv_max=128) == 4
    # max_tokens: 3 more may come, one of them the target's own: 2 drafts
    assert room(4, generated=7, max_tokens=10, position=10, kv_max=128) == 2
    assert room(4, generated=9, max_tokens=10, position=10, kv_max=128) == 0
    # kv_max: positions 125 .. 127 are left, the next token at 125: 2 drafts after it
    assert room(4, generated=1, max_tokens=100, position=125, kv_max=128) == 2
    assert room(4, generated=1, max_tokens=100, position=127, kv_max=128) == 0
    assert room(0, generated=1, max_tokens=100, position=10, kv_max=128) == 0


def test_every_planned_step_stays_inside_both_bounds():
    for k in range(6):
        for generated in range(1, 12):
            for position in range(100, 128):
                n = room(k, generated, 12, position, 128)
                assert 0 <= n <= k
                assert position + n <= 127  # the last position a verify of 1 + n tokens writes
                assert generated + n + 1 <= 12 or n == 0  # the most it can generate
                # and no bound is tighter than it needs to be
                assert n == k or position + n == 127 or generated + n + 1 == 12 or n == 0


def test_lookup_draft_stops_at_an_end_id():
    chooser = TokenChooser(Controls(stop_token_ids=(9,)), [], (1,))
    assert lookup_draft(Context([5, 6, 7, 9, 8, 5, 6]), 4, 1, 2, chooser).tokens == (7, 9)
    assert lookup_draft(Context([5, 6, 7, 1, 8, 5, 6]), 4, 1, 2, chooser).tokens == (7, 1)
    assert lookup_draft(Context([5, 6, 7, 3, 8, 5, 6]), 4, 1, 2, chooser).tokens == (7, 3, 8, 5)
    assert lookup_draft(
        Context([5, 6, 7, 1, 8, 5, 6]), 4, 1, 2, TokenChooser(Controls(ignore_eos=True), [], (1,))
    ).tokens == (7, 1, 8, 5)
