"""runtime.model.ranks: a group of rank processes that fails as a whole, by name and at once, when one
rank raises, stalls or dies; and tensors that travel by value."""

import time

import pytest
import torch

from runtime.model.ranks import RankGroup, TensorParallelError
from support.processes import gone


class Flaky:
    """A rank actor for the failure paths of RankGroup."""

    def __init__(self, rank, tp):
        self.rank = rank

    def nap(self, rank, seconds):
        if self.rank == rank:
            time.sleep(seconds)

    def fail(self, rank):
        if self.rank == rank:
            raise ValueError("this rank is broken")

    def total(self, t):
        return float(t.sum())


def test_a_call_sends_tensors_by_value_and_leaves_the_callers_alone():
    """The host sends views of its tables (prefill's rope rows) while numpy views gather from them:
    the send must not move their storage into shared memory."""
    table = torch.arange(12.0).view(3, 4)
    bits = table.view(torch.int32).numpy()
    group = RankGroup(2, Flaky)
    try:
        assert group.call("total", table[:2]) == [28.0, 28.0]
    finally:
        group.close()
    assert not table.is_shared()
    assert bits.ctypes.data == table.data_ptr()


def test_a_stalled_rank_times_out_and_the_group_shuts_down():
    group = RankGroup(2, Flaky, timeout=60)
    pids = group.pids
    group.timeout = 2
    start = time.monotonic()
    with pytest.raises(TensorParallelError, match=r"tp rank\(s\) \[1\] did not finish nap within 2 s"):
        group.call("nap", 1, 60)
    assert time.monotonic() - start < 20
    assert gone(pids)


def test_a_rank_that_raises_names_itself_and_the_error():
    group = RankGroup(2, Flaky)
    pids = group.pids
    with pytest.raises(TensorParallelError, match="tp rank 0 failed during fail: ValueError: this rank is broken"):
        group.call("fail", 0)
    assert gone(pids)
