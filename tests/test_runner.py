"""runtime.model.runner and its slots: one place holds each slot's state (free, prefilling chunk by
chunk, decoding, retained) and position; a busy slot, a slot with no prompt, a prompt that cannot
fit and a full context are each refused by name."""

import pytest

from runtime.model.loader import load_artifact
from runtime.model.prompt_chunks import chunks
from runtime.model.runner import PromptTooLong
from runtime.model.slot_steps import ContextFull
from runtime.model.slots import SlotState


@pytest.fixture(scope="module")
def runner(compiled):
    loaded = load_artifact(compiled("tiny-e2b", "b4"))  # buckets 16, 32; kv_max 64; 4 slots
    yield loaded.runner
    loaded.close()


def test_a_slot_prefills_chunk_by_chunk_then_decodes_then_retains_its_kv(runner):
    ids = [(7 * i + 3) % 500 for i in range(40)]  # two chunks: longer than the largest bucket
    runner.start(2, ids)
    s = runner.slots[2]
    assert s.state is SlotState.PREFILLING and len(s.plan) == 2
    assert runner.prefill_step(2) is None and s.state is SlotState.PREFILLING
    assert runner.prefill_step(2) is not None
    assert (s.state, s.position) == (SlotState.DECODING, 40)
    with pytest.raises(RuntimeError, match="slot 2 is decoding, not free"):
        runner.start(2, ids)
    runner.decode({2: 7})
    assert s.position == 41 and [t.state for t in runner.slots].count(SlotState.DECODING) == 1
    runner.free(2)
    assert (s.state, s.request, s.tokens) == (SlotState.RETAINED, None, ids + [7])


def test_a_slot_without_a_prompt_cannot_decode(runner):
    with pytest.raises(RuntimeError, match=r"slot 1 has no prompt \(free\)"):
        runner.decode({1: 7})


def test_a_prompt_that_cannot_fit_leaves_the_slot_as_it_was(runner):
    before = runner.slots[0].state
    with pytest.raises(PromptTooLong, match="holds at most 63"):
        runner.start(0, [5] * 64)
    assert runner.slots[0].state is before


def test_a_full_context_is_refused(runner):
    runner.prefill_prompt(3, [5, 80, 300])
    try:
        runner.slots[3].position = runner.geo.kv_max
        with pytest.raises(ContextFull, match="slot 3 reached kv_max=64"):
            runner.decode({3: 7})
    finally:
        runner.free(3)


def test_chunks_fill_the_largest_bucket_then_the_smallest_that_holds_the_rest():
    assert chunks(0, 70, (16, 32)) == [(0, 32, 32), (32, 32, 32), (64, 6, 16)]
    assert chunks(45, 63, (16, 32)) == [(45, 18, 32)]


def test_a_slot_keeps_only_a_prefix_it_holds(runner):
    ids = list(range(100, 130))
    runner.prefill_prompt(1, ids)
    runner.free(1)  # retains the 30 positions
    with pytest.raises(ValueError, match="cannot keep 25 positions for this prompt: it holds 20"):
        runner.start(1, ids[:20] + [1, 2], reused=25)
    assert runner.reusable(1, ids[:20] + [1, 2]) == 20
    runner.start(1, ids[:20] + [1, 2], reused=20)
    assert runner.slots[1].plan == [(20, 2, 16)] and runner.slots[1].tokens == ids[:20]
    assert runner.prefill_step(1) is not None
    runner.free(1)


def test_a_fork_decodes_on_from_a_copy_of_the_source_slots_kv(runner):
    """Slot 1 forked from slot 0 after its prefill decodes exactly as slot 0 does, and as a fresh
    prefill does; the source may be decoding or retained, and a fork is refused by name when the
    source has not finished its prefill, the target is busy, or the source's ring lost the positions."""
    ids = [(11 * i + 5) % 700 for i in range(37)]  # two prefill chunks
    want, _ = runner.greedy(ids, 6, slot=3)
    runner.slots[3].release()
    runner.start(0, ids)
    runner.prefill_step(0)
    with pytest.raises(RuntimeError, match=r"slot 0 cannot be forked: it has not finished a prefill \(prefilling\)"):
        runner.fork(0, 1)
    first = runner.prefill_step(0)
    runner.fork(0, 1)
    assert (runner.slots[1].state, runner.slots[1].position, runner.slots[1].tokens) == (SlotState.DECODING, 37, ids)
    with pytest.raises(RuntimeError, match="slot 1 is decoding, not free"):
        runner.fork(0, 1)
    got = {0: [], 1: []}
    token = {0: int(first.argmax()), 1: int(first.argmax())}
    for _ in range(6):
        for slot in (0, 1):
            got[slot].append(token[slot])
        token = {slot: int(row.argmax()) for slot, row in runner.decode(token).items()}
    assert got[0] == got[1] == want
    runner.free(0)  # retained: 37 prompt positions and 6 more; slot 2 forks from its prompt's end
    runner.fork(0, 2, keep=37)
    assert (runner.slots[2].tokens, runner.slots[2].reach) == (ids, 43)  # the copied ring reached 43
    assert int(runner.decode({2: want[0]})[2].argmax()) == want[1]
    with pytest.raises(
        ValueError,
        match=r"a fork keeps 1 to 43 of them, ending at most 32 before the furthest "
        r"position written there \(42: .* not 5",
    ):
        runner.fork(0, 3, keep=5)
    for slot in (1, 2):
        runner.free(slot)


def test_a_forked_slots_retained_kv_is_reused_exactly(runner):
    """A forked slot's `tokens` say what its KV holds: a later prompt that shares them keeps them and
    continues as a fresh prefill of the whole prompt does."""
    ids = [(13 * i + 2) % 600 for i in range(20)]
    logits = runner.prefill_prompt(0, ids)
    runner.fork(0, 1)
    runner.free(0)
    tok = int(logits.argmax())
    runner.decode({1: tok})
    runner.free(1)
    follow = ids + [tok] + [7, 8, 9]
    assert runner.reusable(1, follow) == 21
    reused, _ = runner.greedy(follow, 5, slot=1, reused=21)
    fresh, _ = runner.greedy(follow, 5, slot=2)
    assert reused == fresh


def test_a_ring_written_past_the_slots_tokens_keeps_no_prefix_it_lost(runner):
    """A later, shorter request cuts a slot's `tokens` but not what its sliding ring (40 keys, window
    8) holds: after 52 positions the keys of positions 0-11 hold 40-51, and a prompt that keeps 18
    positions would read them for its positions 11-17. The reuse rule counts from the furthest write."""
    a = [(19 * i + 7) % 800 for i in range(52)]
    runner.prefill_prompt(0, a)
    runner.free(0)
    b = a[:20] + [3, 4]
    runner.prefill_prompt(0, b, reused=runner.reusable(0, b))  # keeps 20: 51 - 20 <= 32
    runner.free(0)
    c = a[:18] + [5, 6, 7]
    assert (len(runner.slots[0].tokens), runner.slots[0].reach, runner.reusable(0, c)) == (22, 52, 0)
    with pytest.raises(ValueError, match="slot 0 cannot keep 18 positions for this prompt: it holds 0 of them"):
        runner.start(0, c, reused=18)
    d = a[:20] + [3, 9, 9]  # shares 21 with the slot's tokens: 51 - 21 <= 32, still whole
    assert runner.reusable(0, d) == 21
    assert runner.greedy(d, 4, slot=0, reused=21)[0] == runner.greedy(d, 4, slot=1)[0]
