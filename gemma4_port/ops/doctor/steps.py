"""One doctor step: a `build.py` command in a process of its own (the Neuron runtime holds the cores a
process opened until it exits, and ModelBuilder wants a process per trace), its whole output in a log
in the report folder, its wall time, and the peak RSS of its process tree (neuronx-cc runs in child
processes of the compile: their RAM counts). Nothing here raises: a step that cannot start, fails or
times out is a Step that says so."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from gemma4_port import child_env

TIMEOUT_S = {"compile": 6 * 3600, "verify": 3600, "serve": 1800, "bench": 3600}
TAIL_LINES = 5  # of a failed step's log, in the report's table; the whole log is in the folder
COMPILER_LOGS = ("*.txt", "*.log", "*.json")  # what a compiler workdir keeps besides HLO and neffs


@dataclass
class Step:
    target: str
    step: str
    ok: bool
    seconds: float
    detail: str = ""
    peak_rss: int | None = None  # bytes, the process tree's sum at its largest sample
    log: str | None = None  # relative to the report folder
    data: dict = field(default_factory=dict)


class TreeRss:
    """The peak summed RSS of a process and its descendants, sampled every `period_s` on a thread."""

    def __init__(self, pid: int, period_s: float = 0.5):
        self.peak = 0
        self._pid, self._period, self._stop = pid, period_s, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss(self._pid))
            self._stop.wait(self._period)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def tree_rss(pid: int) -> int:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:  # exited between the listing and the read
            pass
    return total


def tail(log: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    kept = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " / ".join(kept[-lines:])


def run_cli(target: str, step: str, args: list, env: dict, report: Path, log: Path) -> Step:
    """`python -m gemma4_port ARGS` (build.py's command line, from a checkout or a wheel) with its output
    in `log` (inside the `report` folder)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    rc: int | None = None
    peak = None
    why = ""
    with open(log, "w") as out:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gemma4_port", *map(str, args)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=child_env(env),
            )
        except OSError as exc:
            why = f"could not start: {exc}"
        else:
            rss = TreeRss(proc.pid)
            try:
                rc = proc.wait(TIMEOUT_S[step])
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                why = f"timed out after {TIMEOUT_S[step]} s"
            peak = rss.stop() or None
    seconds = round(time.perf_counter() - start, 1)
    rel = str(log.relative_to(report))
    if rc == 0:
        return Step(target, step, True, seconds, peak_rss=peak, log=rel)
    detail = why or f"exit {rc}: {tail(log)}"
    return Step(target, step, False, seconds, f"{detail} (whole log: {rel})", peak, rel)


def copy_logs(src: Path, dest: Path) -> list[str]:
    """The compiler workdir's logs (every key's neuronx-cc log, not its HLO or neffs), whole, into the
    report folder; the names copied."""
    copied = []
    if not src.is_dir():
        return copied
    for pattern in COMPILER_LOGS:
        for f in sorted(src.rglob(pattern)):
            if f.is_file():
                to = dest / f.relative_to(src)
                to.parent.mkdir(parents=True, exist_ok=True)
                try:
                    shutil.copyfile(f, to)
                except OSError:
                    continue
                copied.append(str(to.relative_to(dest)))
    return sorted(copied)
