"""runtime.model.runner and its slots: one place holds each slot's state (free, prefilling, decoding)
and position; a slot with no prompt or a full context is refused by name."""

import pytest

from runtime.model.loader import load_artifact
from runtime.model.runner import ContextFull, PromptTooLong
from runtime.model.slots import SlotState


@pytest.fixture(scope="module")
def model(compiled):
    loaded = load_artifact(compiled("tiny-e2b", "b4"))
    yield loaded
    loaded.close()


class Watching:
    """The real backend, noting each slot's state while a graph runs."""

    def __init__(self, runner):
        self.runner, self.backend, self.seen = runner, runner.backend, []

    def prefill(self, bucket, inputs):
        self.seen.append([s.state for s in self.runner.slots])
        return self.backend.prefill(bucket, inputs)

    def decode(self, keys, inputs):
        self.seen.append([s.state for s in self.runner.slots])
        return self.backend.decode(keys, inputs)


def test_a_slot_goes_free_prefilling_decoding_free(model):
    runner = model.runner
    assert [s.state for s in runner.slots] == [SlotState.FREE] * 4
    watch = Watching(runner)
    runner.backend = watch
    try:
        runner.prefill(2, [5, 80, 300])
        assert watch.seen[-1][2] is SlotState.PREFILLING
        assert (runner.slots[2].state, runner.slots[2].position) == (SlotState.DECODING, 3)
        runner.decode({2: 7})
        assert watch.seen[-1] == [SlotState.FREE, SlotState.FREE, SlotState.DECODING, SlotState.FREE]
        assert runner.slots[2].position == 4
    finally:
        runner.backend = watch.backend
        runner.free(2)
    assert (runner.slots[2].state, runner.slots[2].position, runner.slots[2].request) == (SlotState.FREE, 0, None)


def test_a_free_slot_cannot_decode(model):
    with pytest.raises(RuntimeError, match="slot 1 has no prompt"):
        model.runner.decode({1: 7})


def test_a_prompt_over_the_largest_bucket_leaves_the_slot_free(model):
    runner = model.runner
    with pytest.raises(PromptTooLong, match="largest prefill bucket is 32"):
        runner.prefill(0, [5] * 33)
    assert runner.slots[0].state is SlotState.FREE


def test_a_full_context_is_refused(model):
    runner = model.runner
    runner.prefill(0, [5, 80, 300])
    try:
        runner.slots[0].position = runner.geo.kv_max
        with pytest.raises(ContextFull, match="slot 0 reached kv_max=64"):
            runner.decode({0: 7})
    finally:
        runner.free(0)
