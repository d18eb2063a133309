"""A slot's life, owned in one place: free -> prefilling chunk k -> decoding -> retained -> prefilling
again, keeping a prefix of what it retained."""

from runtime.model.prompt_chunks import chunks
from runtime.model.slots import Slot, SlotState


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
