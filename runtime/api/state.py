"""What one Flask app serves with, kept on the app (`app.extensions`) and reached through
`server_state()` alone: the engine, and the per-app bookkeeping of the routes, each part bounded
where clients choose what goes in (the unknown field names remembered, the log lines about them)."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flask import Flask, current_app

from runtime.bounded import BoundedThreads
from runtime.log_gate import LogGate, SeenOnce, shown
from runtime.settings import MediaLimits, RequestLimits

if TYPE_CHECKING:  # the gunicorn master reads the state's module too, and must not import torch
    from runtime.api.media_prompt import MediaProcessors
    from runtime.api.templating import Templates
    from runtime.generate.engine import Engine

log = logging.getLogger("gemma4.api")

_EXTENSION = "gemma4"
OPEN_PATHS = ("/health", "/ready", "/metrics")  # probes and scrapers: no key, and answered while draining
MAX_IGNORED_SHOWN = 8  # unknown field names logged for one request


@dataclass
class ServerState:
    engine: Engine
    limits: RequestLimits = field(default_factory=RequestLimits)  # the app's settings' (create_app)
    # One request tokenizes at a time: each thread doing it competes with the engine thread for the
    # interpreter, and 4 at once made a running stream's tokens 5x slower.
    tokenizer_lock: threading.Lock = field(default_factory=threading.Lock)
    draining: threading.Event = field(default_factory=threading.Event)  # set by the HTTP worker on SIGTERM
    _ignored: SeenOnce = field(init=False)
    _ignored_gate: LogGate = field(default_factory=LogGate)
    templates: Templates = field(init=False)  # chat templates, outside the tokenizer lock, bounded
    media: MediaLimits = field(default_factory=MediaLimits)  # the app's settings' (create_app)
    preparer: BoundedThreads = field(init=False)  # media parts fetched, decoded and preprocessed, with a deadline
    _processors: MediaProcessors | None = field(default=None, init=False)
    _processors_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self):
        limits = self.limits
        self._ignored = SeenOnce(limits.max_ignored_fields)
        from runtime.api.templating import Templates  # transformers' templating: the worker's, not the master's

        self.templates = Templates(limits)
        self.preparer = BoundedThreads("media", self.media.prepare_threads)

    def processors(self) -> MediaProcessors:
        """The media processors of the engine's model (one that takes media), made on first use: the
        model is loaded by then, and the server's media modules stay out of the gunicorn master."""
        with self._processors_lock:
            if self._processors is None:
                from runtime.api.media_prompt import processors_for

                self._processors = processors_for(self.engine.model, self.media)
            return self._processors

    def log_ignored(self, names: list[str]) -> None:
        """Unknown request fields, each named once while the set of names seen has room, at most
        MAX_IGNORED_SHOWN lines a request, and only as many lines as the gate lets through."""
        fresh = self._ignored.new(names)
        for name in fresh[:MAX_IGNORED_SHOWN]:
            allowed, held_back = self._ignored_gate.allow()
            if allowed:
                earlier = f"; {held_back} such lines held back before this one" if held_back else ""
                log.warning("request field %s is not supported and is ignored (logged once%s)", shown(name), earlier)
        if len(fresh) > MAX_IGNORED_SHOWN and self._ignored_gate.allow()[0]:
            log.warning("and %d more unsupported request fields, ignored", len(fresh) - MAX_IGNORED_SHOWN)


def install(app: Flask, state: ServerState) -> None:
    app.extensions[_EXTENSION] = state


def server_state(app: Flask | None = None) -> ServerState:
    """The state of `app` (by default the app of the request being served)."""
    return (app or current_app).extensions[_EXTENSION]
