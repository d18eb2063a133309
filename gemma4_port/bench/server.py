"""The real server, started the way a user starts it (`build.py serve DIR` on loopback), watched from
outside: readiness, the gunicorn worker's RSS and peak RSS, and every module the server imported.

CPython's own import log (PYTHONPROFILEIMPORTTIME, inherited by the forked worker) tells whether
`transformers.models.gemma4.modeling_gemma4`, where every Gemma-4 model class comes from, was ever
imported: if it was not, no Gemma-4 model object can exist in the server. (Not transformers'
`modeling_utils`: its image processors import that through `processing_utils`, model or not.)"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import requests

from gemma4_port import child_env
from gemma4_port.bench.bench_error import BenchError

MODEL_MODULE = "transformers.models.gemma4.modeling_gemma4"
IMPORT_LOG_PREFIX = "import time:"
ARMED_BY = "runtime.model.loader"  # seen in the log: the import log covers the code that loads the model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vm_hwm(pid: int) -> int:
    """Peak resident set size of a live process in bytes: Linux's VmHWM (ru_maxrss would also count
    the RSS of the process that forked it, carried across exec)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise BenchError(f"/proc/{pid}/status has no VmHWM")


def imported_modules(log: str) -> set[str]:
    """Module names from a PYTHONPROFILEIMPORTTIME log ("import time: self | cumulative | name")."""
    lines = (line for line in log.splitlines() if line.startswith(IMPORT_LOG_PREFIX) and "|" in line)
    return {line.rsplit("|", 1)[1].strip() for line in lines}


class Server:
    """`build.py serve DIR` on loopback in a process of its own, which is the gunicorn master.
    `with Server(folder, logs) as s:` starts it and waits until it is ready -> s.url, s.model,
    s.worker (psutil.Process), s.load_s; or `start()` several, then `wait_ready()` each."""

    def __init__(self, folder: Path, logs: Path, ready_timeout_s: float = 600.0, env: dict[str, str] | None = None):
        self.folder, self.ready_timeout_s, self.env = Path(folder), ready_timeout_s, env or {}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        logs.mkdir(parents=True, exist_ok=True)
        self.stdout_path = logs / f"server-{self.port}.out"
        self.stderr_path = logs / f"server-{self.port}.err"  # gunicorn's and the engine's log
        self.proc: subprocess.Popen | None = None
        self.worker: psutil.Process | None = None
        self.model = ""
        self.load_s = float("nan")
        self._started = float("nan")

    def __enter__(self) -> Server:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> Server:
        cmd = [
            sys.executable,
            "-m",
            "gemma4_port",
            "serve",
            str(self.folder),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        env = child_env() | {"PYTHONPROFILEIMPORTTIME": "1", "PYTHONUNBUFFERED": "1"} | self.env
        self._started = time.perf_counter()
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err)
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        reason = "no answer yet"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(
                    f"the server exited with code {self.proc.returncode} before it was ready: {self.tail()}"
                )
            try:
                r = requests.get(self.url + "/ready", timeout=5)
                body = r.json()
                if r.status_code == 200:
                    self.model = body["model"]
                    self.worker = self._find_worker()
                    self.load_s = time.perf_counter() - self._started
                    return
                if body.get("state") == "failed":
                    raise BenchError(f"the server's self-test failed: {body.get('reason')}")
                reason = f"{body.get('state')}: {body.get('reason')}"
            except (requests.ConnectionError, requests.Timeout, ValueError) as exc:
                reason = type(exc).__name__
            time.sleep(0.2)
        raise BenchError(f"the server was not ready after {self.ready_timeout_s:.0f} s ({reason})")

    def _find_worker(self) -> psutil.Process:
        """`build.py serve` is the gunicorn master itself; its only child is the worker."""
        children = psutil.Process(self.proc.pid).children()
        if len(children) != 1:
            raise BenchError(f"expected one gunicorn worker under pid {self.proc.pid}, found {len(children)}")
        return children[0]

    def rss(self) -> int:
        return self.worker.memory_info().rss

    def peak_rss(self) -> int:
        return vm_hwm(self.worker.pid)

    def master_rss(self) -> int:
        return psutil.Process(self.proc.pid).memory_info().rss

    def imports(self) -> dict:
        """Whether the server imported transformers' model base module (armed: the log is complete)."""
        modules = imported_modules(self.stderr_path.read_text(errors="replace"))
        return {
            "import_log_armed": ARMED_BY in modules,
            "modules_imported": len(modules),
            "transformers_modules": len([m for m in modules if m.startswith("transformers")]),
            "transformers_model_module_imported": MODEL_MODULE in modules,
        }

    def tail(self, lines: int = 5) -> str:
        text = [
            ln
            for ln in self.stderr_path.read_text(errors="replace").splitlines()
            if not ln.startswith(IMPORT_LOG_PREFIX)
        ]
        return " | ".join(text[-lines:])

    def stop(self) -> int | None:
        """SIGTERM to the master (gunicorn's graceful stop); SIGKILL to master and worker if it hangs.
        -> the master's exit code (None if it never started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                if self.worker is not None:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        self.worker.kill()
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
