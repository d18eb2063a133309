"""`build.py serve DIR` and `python -m runtime.serve` (the images' CMD): read the settings once,
check them and the artifact, then run gunicorn in this process (its master: signals such as SIGTERM
go straight to it) with the app built from those same settings in the worker."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from gunicorn.app.base import BaseApplication

from contract.artifact import load_meta
from contract.errors import Gemma4Error
from runtime.api.state import server_state
from runtime.settings import ENV, ServerSettings, check_backend, check_port


def gunicorn_options(settings: ServerSettings) -> dict:
    """One worker, because the device has one owner (the engine thread inside it); threads, because
    every streaming or waiting request holds one."""
    return {
        "bind": [f"{settings.host}:{settings.port}"],
        "workers": 1,
        "worker_class": "runtime.http.worker.ReadAheadWorker",  # gthread, each request read by the main loop first
        # Every running, queued or streaming request holds a thread; the spare ones answer probes and
        # scrapes, and a queue-full 503, while the queue is full.
        "threads": settings.queue_max + 32,
        "preload_app": False,  # the engine thread must start in the worker, not in the master before the fork
        "timeout": 120,  # heartbeat of the worker's main loop; loading happens in a background thread
        "graceful_timeout": 60,  # on SIGTERM: drain (runtime/httpworker.py), let the requests in flight finish, exit
        "keepalive": 5,
        "accesslog": "-",
        "logger_class": "runtime.http.accesslog.RedactingLogger",  # no credential in any line it writes
        "errorlog": "-",
        "loglevel": "info",
        "control_socket_disable": True,  # gunicorn 27 would otherwise share one socket path between servers
        "worker_exit": _worker_exit,
    }


def _worker_exit(server, worker) -> None:
    """The requests in flight are done: stop the engine thread before the interpreter goes away
    (a daemon thread killed inside a graph call aborts the process)."""
    app = getattr(worker, "wsgi", None)
    if app is not None:
        server_state(app).engine.close()


class GunicornServer(BaseApplication):
    """gunicorn with its configuration and its app from one ServerSettings object."""

    def __init__(self, settings: ServerSettings):
        self.settings = settings
        super().__init__()

    def load_config(self) -> None:
        for key, value in gunicorn_options(self.settings).items():
            self.cfg.set(key, value)

    def load(self):
        # Imported in the worker, after the fork: torch and the engine never load in the master.
        from runtime.http.app import create_app

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        return create_app(self.settings)


def checked_settings(environ: Mapping[str, str]) -> ServerSettings:
    """The settings and the artifact they name, validated: a bad variable or artifact is one line
    and exit 2, not a worker crash."""
    settings = ServerSettings.from_env(environ)
    check_backend(settings, load_meta(settings.artifact).backend)
    check_port(settings)
    return settings


def run(environ: Mapping[str, str]) -> int:
    settings = checked_settings(environ)
    # One engine thread owns the device; torch's default intra-op pool stalls on a busy small host
    # (measured up to 10x slower on 2 vCPUs), so one thread unless the operator says otherwise. Set
    # here, before the worker imports torch.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    GunicornServer(settings).run()
    return 0


def serve(folder: Path, host: str, port: int, backend: str) -> int:
    overrides = {
        ENV["artifact"]: str(Path(folder).resolve()),
        ENV["host"]: host,
        ENV["port"]: str(port),
        ENV["backend"]: backend,
    }
    return run(os.environ | overrides)


def main() -> int:
    try:
        return run(os.environ)
    except Gemma4Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
