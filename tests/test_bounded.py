"""runtime.bounded: a deadline per call, a bound on calls at once, errors passed to the caller."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from runtime.bounded import QUEUED_PER_THREAD, BoundedThreads, Busy, Late


def test_a_result_and_an_error_reach_the_caller():
    threads = BoundedThreads("t", 1)
    assert threads.run(lambda: 41 + 1, 5) == 42
    with pytest.raises(ZeroDivisionError):
        threads.run(lambda: 1 / 0, 5)


def test_a_late_call_is_answered_at_its_deadline_and_a_full_queue_is_busy():
    threads, gate = BoundedThreads("t", 1), threading.Event()
    try:
        with pytest.raises(Late, match="0.05 s"):
            threads.run(lambda: gate.wait(10), 0.05)  # holds the only thread until the gate opens
        for _ in range(QUEUED_PER_THREAD):
            with pytest.raises(Late):
                threads.run(lambda: None, 0.01)  # queued behind it, never started
        with pytest.raises(Busy):
            threads.run(lambda: None, 0.01)
    finally:
        gate.set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the thread skips the cancelled calls, then takes new ones
        with contextlib.suppress(Busy):
            assert threads.run(lambda: "free again", 5) == "free again"
            break
    else:
        pytest.fail("the queue never drained")


def test_the_stack_size_applies_to_its_threads_only():
    before = threading.stack_size()
    BoundedThreads("t", 1, 64 << 20)
    assert threading.stack_size() == before
