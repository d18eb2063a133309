"""gunicorn settings for the server: `gunicorn -c runtime/gunicorn.conf.py runtime.wsgi:app`.

One worker, because the device has one owner (the engine thread inside it); threads, because every
streaming or waiting request holds one."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runtime.settings import Settings, SettingsError  # noqa: E402

try:
    _settings = Settings.from_env()
except SettingsError as exc:
    sys.exit(f"error: {exc}")

bind = [f"{_settings.host}:{_settings.port}"]
pythonpath = str(ROOT)
workers = 1
worker_class = "gthread"
# Every running, queued or streaming request holds a thread; the spare ones answer probes and
# scrapes, and a queue-full 503, while the queue is full.
threads = _settings.queue_max + 32
preload_app = False  # the engine thread must start in the worker, not in the master before the fork
timeout = 120  # heartbeat of the worker's main loop; loading happens in a background thread
graceful_timeout = 60  # on SIGTERM: stop accepting, let the requests in flight finish, then exit
keepalive = 5
accesslog = "-"
errorlog = "-"
loglevel = "info"
control_socket_disable = True  # gunicorn 27 would otherwise share one socket path between servers


def worker_exit(server, worker):
    """The requests in flight are done: stop the engine thread before the interpreter goes away
    (a daemon thread killed inside a graph call aborts the process)."""
    app = getattr(worker, "wsgi", None)
    if app is not None:
        app.extensions["gemma4_engine"].close()
