"""A slot's life, owned in one place: free -> prefilling chunk k -> decoding -> retained, and what the
runner refuses to start (a busy slot, a prompt over the context, a prefix the slot cannot keep)."""

import pytest

from gemma4_port.configs import text_config_for
from gemma4_port.manifest import load_manifest
from gemma4_port.sharding import shard_model
from gemma4_port.tracing import geometry
from runtime.model.runner import ModelRunner, PromptTooLong, chunks
from runtime.model.slots import Slot, SlotState
from support import MANIFESTS


@pytest.fixture(scope="module")
def geo():
    manifest = load_manifest(MANIFESTS / "tiny-e2b.yaml")
    config = text_config_for(manifest)
    return geometry(config, shard_model(config), manifest.variant("b4"))  # buckets 16, 32; kv_max 64; ring 40


def test_a_slot_goes_free_prefilling_decoding_retained():
    s = Slot(0)
    assert s.state is SlotState.FREE and s.free
    s.start(list(range(40)), 0, chunks(0, 40, (16, 32)))
    assert s.state is SlotState.PREFILLING and not s.free and s.plan == [(0, 32, 32), (32, 8, 16)]
    s.wrote(list(range(32)))
    s.chunk += 1
    assert (s.position, s.chunk) == (32, 1)  # prefilling chunk 1 next
    s.wrote(list(range(32, 40)))
    s.state = SlotState.DECODING
    s.wrote([99])
    s.release()
    assert s.state is SlotState.RETAINED and s.free and s.tokens == list(range(40)) + [99]
    s.start(list(range(30)) + [7], 30, chunks(30, 31, (16, 32)))  # keeps 30 positions, prefills one
    assert s.tokens == list(range(30)) and s.position == 30 and s.plan == [(30, 1, 16)]


def test_a_slot_that_wrote_nothing_is_free_again():
    s = Slot(1)
    s.start([5], 0, chunks(0, 1, (16,)))
    s.release()  # cancelled before its first chunk
    assert s.state is SlotState.FREE and s.tokens == []


def test_chunks_fill_the_largest_bucket_then_the_smallest_that_holds_the_rest():
    assert chunks(0, 70, (16, 32)) == [(0, 32, 32), (32, 32, 32), (64, 6, 16)]
    assert chunks(45, 63, (16, 32)) == [(45, 18, 32)]


def test_the_runner_refuses_what_a_slot_cannot_start(geo):
    runner = ModelRunner(geo, host=None, backend=None)  # start() touches neither
    runner.start(0, [1, 2, 3])
    with pytest.raises(RuntimeError, match="slot 0 is prefilling, not free"):
        runner.start(0, [4])
    with pytest.raises(PromptTooLong, match="64 tokens; this model holds at most 63"):
        runner.start(1, [1] * 64)
    runner.slots[2].tokens = list(range(100, 130))
    runner.slots[2].state = SlotState.RETAINED
    with pytest.raises(ValueError, match="cannot keep 25 positions for this prompt: it holds 20"):
        runner.start(2, list(range(100, 120)) + [1, 2], reused=25)
    runner.start(2, list(range(100, 120)) + [1, 2], reused=20)
    assert runner.slots[2].plan == [(20, 2, 16)]
