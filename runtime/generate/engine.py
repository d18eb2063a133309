"""The engine: one thread that owns the model and the device.

It loads the artifact, proves the output correct (the self-test), then serves: HTTP threads only
submit jobs and read their events; the engine thread admits them into KV slots and steps the model
(runtime.generate.scheduler), and turns each step's logits into tokens and events
(runtime.generate.output). This module is the lifecycle: states, readiness, liveness, drain, close."""

from __future__ import annotations

import logging
import queue
import threading
import time
from enum import StrEnum
from pathlib import Path

from contract.artifact import Geometry
from contract.errors import Gemma4Error
from runtime.generate.grammar import LazyGrammarCompiler
from runtime.generate.output import OutputProcessor
from runtime.generate.scheduler import Scheduler
from runtime.generate.sequence import Job
from runtime.generate.speculation import Speculator
from runtime.metrics import Metrics
from runtime.model.loader import LoadedModel, load_artifact
from runtime.settings import ServerSettings

log = logging.getLogger("gemma4.engine")

# A prefill or decode call still running after this long: the device or its runtime hangs, and only a
# restart helps (a step takes milliseconds; a prefill chunk of the largest bucket well under a second).
STUCK_AFTER_S = 60.0


class State(StrEnum):
    LOADING = "loading"
    SELF_TEST = "self-test"
    READY = "ready"
    DRAINING = "draining"  # SIGTERM: the requests in flight finish, new ones are refused
    FAILED = "failed"
    STOPPED = "stopped"  # closed on shutdown


class NotReady(Gemma4Error, RuntimeError):
    pass


class QueueFull(Gemma4Error, RuntimeError):
    pass


class Engine:
    """`settings` were checked against the artifact where they were read (runtime.serve)."""

    def __init__(self, settings: ServerSettings, metrics: Metrics | None = None):
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.state = State.LOADING
        self.served = False  # it was ready once: a later death is the process's, and a restart helps
        self.reason = "loading the artifact"
        self._model: LoadedModel | None = None
        self._grammars: LazyGrammarCompiler | None = None
        self._scheduler: Scheduler | None = None
        self.model_name = settings.model_name
        self._queue: queue.Queue[list[Job]] = queue.Queue(maxsize=settings.queue_max)
        self._lock = threading.Lock()  # state changes vs. submissions: no job is queued after the drain
        self._closing = threading.Event()
        self._settled = threading.Event()  # set once ready, failed or stopped
        self._thread = threading.Thread(target=self._run, name="gemma4-engine", daemon=True)
        self.metrics.watch(queue_depth=lambda: self.queue_depth, busy_slots=lambda: self.busy_slots)

    # -- what the HTTP threads read (set once loading succeeded) ---------------------------------
    @property
    def model(self) -> LoadedModel:
        if self._model is None:
            raise NotReady(f"the model is not loaded ({self.state.value}: {self.reason})")
        return self._model

    @property
    def grammars(self) -> LazyGrammarCompiler:
        if self._grammars is None:
            raise NotReady(f"the model is not loaded ({self.state.value}: {self.reason})")
        return self._grammars

    @property
    def geometry(self) -> Geometry:
        return self.model.meta.geometry

    @property
    def tokenizer(self):
        return self.model.tokenizer

    @property
    def busy_slots(self) -> int:
        scheduler = self._scheduler
        return 0 if scheduler is None else len(scheduler.running())

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize()

    @property
    def idle(self) -> bool:
        return not self.busy_slots and self._queue.empty()

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> Engine:
        log.info("engine state: %s (%s)", self.state.value, self.settings.artifact)
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> State:
        """Block until the engine is ready, failed or stopped (or the timeout passes)."""
        self._settled.wait(timeout)
        return self.state

    def drain(self) -> None:
        """Refuse new requests (503, retry elsewhere) and let the ones in flight finish."""
        if self.state is State.READY:
            self._set(State.DRAINING, "the server is shutting down: finishing the requests in flight")

    def problem(self) -> str | None:
        """Why this process should be restarted (liveness), or None: the engine thread is gone, or a
        device call it started has not returned within STUCK_AFTER_S."""
        if self.state is State.FAILED or (self.state is not State.STOPPED and not self._thread.is_alive()):
            return "the engine thread is not running"
        started = None if self._scheduler is None else self._scheduler.call_started
        if started is not None and time.monotonic() - started > STUCK_AFTER_S:
            return (
                f"a device call has not returned for {time.monotonic() - started:.0f} s (bound {STUCK_AFTER_S:.0f} s)"
            )
        return None

    def close(self, timeout: float = 30.0) -> None:
        """Stop the engine thread; requests still waiting or running get a Failed event."""
        if self.state is not State.FAILED:
            self._set(State.STOPPED, "the server is shutting down")
        self._closing.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._fail_all("the server is shutting down")
        if self._model is not None:
            self._model.close()
            self._model = None

    def submit(self, job: Job, choices: int = 1) -> Job:
        """Queue a job with its other choices (n > 1: seeds seed + i, one event queue, one prefill)."""
        jobs = job.choices(choices)
        with self._lock:
            if self.state is not State.READY:
                raise NotReady(f"the model is not ready ({self.state.value}: {self.reason})")
            try:
                self._queue.put_nowait(jobs)
            except queue.Full:
                raise QueueFull(
                    f"all {self.geometry.batch} slot(s) are busy and {self.settings.queue_max} "
                    "request(s) are already waiting; retry shortly"
                ) from None
        return job

    def _set(self, state: State, reason: str = "") -> None:
        with self._lock:
            if self.state is State.STOPPED:
                return  # closed while loading: the loading thread must not bring it back
            self.state, self.reason = state, reason
        self.metrics.ready.set(state is State.READY)
        if state is not State.SELF_TEST:
            self._settled.set()
        if state is State.FAILED:
            log.error("engine state: %s: %s", state.value, reason)
        else:
            log.info("engine state: %s%s", state.value, f" ({reason})" if reason else "")

    def _fail_all(self, message: str) -> None:
        if self._scheduler is not None:
            self._scheduler.fail_all(message)

    def _run(self) -> None:
        try:
            model = self._model = load_artifact(self.settings.artifact, on_encode=self.metrics.encoded)
            geo = model.meta.geometry
            self._grammars = LazyGrammarCompiler(
                model.tokenizer, geo.vocab, model.meta.eos_token_ids, self.settings.grammar_limits
            )
            self.model_name = self.settings.model_name or model.meta.name
            self.metrics.slots.set(geo.batch)
            self._set(State.SELF_TEST, f"{len(model.meta.golden)} golden prompt(s)")
            model.self_test()
            speculator = Speculator(self.settings.speculative, model.runner)
            output = OutputProcessor(model, self.metrics, lookup=speculator.method == "lookup")
            scheduler = self._scheduler = Scheduler(
                self.settings, self.metrics, self._queue, model.runner, output, speculator
            )
        except Exception as exc:  # every failure to come up is reported by /ready, not raised
            log.exception("loading or self-test failed")
            self._set(State.FAILED, self._public(exc))
            return
        self.served = True
        self._set(State.READY, f"serving {self.model_name} with {geo.batch} slot(s)")
        try:
            while not self._closing.is_set():
                scheduler.admit()
                if scheduler.running():
                    scheduler.step()
        except Exception as exc:  # the device state is unknown now: stop claiming readiness
            log.exception("engine loop failed")
            self._set(State.FAILED, f"engine error: {type(exc).__name__} (the server log has the details)")
            self._fail_all("engine error (the server log has the details)")

    def _public(self, exc: Exception) -> str:
        """Why loading failed, as unauthenticated probes may show it: this project's own errors say
        what to do (with the artifact's folder as `<artifact>`, not its absolute path); anything else
        only its type. The log has the whole of it."""
        if not isinstance(exc, Gemma4Error):
            return f"{type(exc).__name__} while loading (the server log has the details)"
        return f"{type(exc).__name__}: {exc}".replace(
            str(Path(self.settings.artifact).resolve()), "<artifact>"
        ).replace(str(self.settings.artifact), "<artifact>")
