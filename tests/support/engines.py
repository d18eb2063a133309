"""An engine for the tests that drive one directly: started in the background, closed on the way
out whatever the test saw (a live engine thread would outlive its module)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from runtime.generate.engine import Engine, State
from runtime.settings import ServerSettings


@contextmanager
def running(settings: ServerSettings) -> Iterator[Engine]:
    engine = Engine(settings).start()
    try:
        yield engine
    finally:
        engine.close()


@contextmanager
def ready(settings: ServerSettings, timeout: float = 300) -> Iterator[Engine]:
    """A running engine that came up READY (loaded and self-tested), or the test fails with its reason."""
    with running(settings) as engine:
        assert engine.wait(timeout) is State.READY, engine.reason
        yield engine
