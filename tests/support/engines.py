"""An engine for the tests that drive one directly: started in the background, closed on the way
out whatever the test saw (a live engine thread would outlive its module)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from runtime.engine import Engine
from runtime.settings import Settings


@contextmanager
def running(settings: Settings) -> Iterator[Engine]:
    engine = Engine(settings).start()
    try:
        yield engine
    finally:
        engine.close()
