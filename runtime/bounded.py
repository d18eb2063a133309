"""Work a request waits for with a deadline, on a few threads of its own: `BoundedThreads.run(call,
timeout_s)` returns the call's result, raises what it raised, or `Late` once the deadline passes and
`Busy` when every thread is taken and enough calls wait. A late call is not stopped (Python cannot
stop a thread): it runs to its end on its thread, so what it may cost must be bounded where it is
made (llguidance's fuel; a chat render checks its own deadline, runtime.api.templating); the request
that asked is answered at once, and at most `threads` such calls run at a time, whatever the number
of requests."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TypeVar

from contract.errors import Gemma4Error

T = TypeVar("T")
QUEUED_PER_THREAD = 4  # calls waiting for a thread, beyond which a request is told to retry


class Busy(Gemma4Error, RuntimeError):
    """Every thread is taken and enough calls wait: retry shortly (a 503)."""


class Late(Gemma4Error, TimeoutError):
    """The call did not finish by its deadline."""


class BoundedThreads:
    def __init__(self, name: str, threads: int, stack_bytes: int = 0):
        """`stack_bytes`: the native stack of each thread (0: the platform's default)."""
        self._jobs: queue.Queue = queue.Queue(maxsize=threads * QUEUED_PER_THREAD)
        previous = threading.stack_size(stack_bytes)
        try:
            for i in range(threads):
                threading.Thread(target=self._work, name=f"gemma4-{name}-{i}", daemon=True).start()
        finally:
            threading.stack_size(previous)

    def _work(self) -> None:
        while True:
            call, future = self._jobs.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call())
                except Exception as exc:  # noqa: BLE001 - the caller gets it
                    future.set_exception(exc)

    def run(self, call: Callable[[], T], timeout_s: float) -> T:
        future: Future = Future()
        try:
            self._jobs.put_nowait((call, future))
        except queue.Full:
            raise Busy("the server is busy with work of this kind; retry shortly") from None
        try:
            return future.result(timeout_s)
        except FutureTimeout:
            future.cancel()  # if it has not started, it never will
            raise Late(f"not done within {timeout_s:g} s") from None
