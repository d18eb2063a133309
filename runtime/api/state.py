"""What one Flask app serves with, kept on the app (`app.extensions`) and reached through
`server_state()` alone: the engine, and the per-app bookkeeping of the routes."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flask import Flask, current_app

if TYPE_CHECKING:  # the gunicorn master reads the state's module too, and must not import torch
    from runtime.generate.engine import Engine

_EXTENSION = "gemma4"


@dataclass
class ServerState:
    engine: Engine
    # One request tokenizes (or templates) at a time: each thread doing it competes with the engine
    # thread for the interpreter, and 4 at once made a running stream's tokens 5x slower.
    tokenizer_lock: threading.Lock = field(default_factory=threading.Lock)
    _ignored_logged: set[str] = field(default_factory=set)
    _ignored_lock: threading.Lock = field(default_factory=threading.Lock)

    def first_time_ignored(self, name: str) -> bool:
        """Whether an unknown request field `name` is seen for the first time (it is logged once)."""
        with self._ignored_lock:
            if name in self._ignored_logged:
                return False
            self._ignored_logged.add(name)
            return True


def install(app: Flask, state: ServerState) -> None:
    app.extensions[_EXTENSION] = state


def server_state(app: Flask | None = None) -> ServerState:
    """The state of `app` (by default the app of the request being served)."""
    return (app or current_app).extensions[_EXTENSION]
