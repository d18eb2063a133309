"""`neuron-monitor` sampled while a step runs, and what the report takes from it.

neuron-monitor prints one JSON document per line and period (aws-neuron-sdk v2.28.0
tools/neuron-sys-tools/neuron-monitor-user-guide.rst:185-235). Per Neuron runtime (process) it
reports `memory_used.neuron_runtime_used_bytes.usage_breakdown.neuroncore_memory_usage`, a core's
device memory by category (constants, model_code, model_shared_scratchpad, runtime_memory, tensors:
user guide :534-560, the categories plan counts), and `neuroncore_counters.neuroncores_in_use`, each
core's utilisation in percent (:390-437). Every raw line is kept in the report folder; the summary is
each core's peak per category (summed over the processes that hold it) and its utilisation while it
was in use. A missing or failing tool gives no samples and a reason, never an exception.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

CATEGORIES = ("tensors", "constants", "model_code", "model_shared_scratchpad", "runtime_memory")


def config(period_s: int = 1) -> dict:
    return {
        "period": f"{period_s}s",
        "neuron_runtimes": [
            {"tag_filter": ".*", "metrics": [{"type": "memory_used"}, {"type": "neuroncore_counters"}]}
        ],
        "system_metrics": [],
    }


def _start(cfg: dict) -> tuple[subprocess.Popen, str]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg, f)
    proc = subprocess.Popen(
        ["neuron-monitor", "-c", f.name], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    return proc, f.name


def _end(proc: subprocess.Popen, cfg_file: str) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    with contextlib.suppress(OSError):
        os.unlink(cfg_file)


def monitor_once(timeout_s: float = 15) -> tuple[dict | None, str]:
    """neuron-monitor's first report (memory in use before doctor starts anything), or None and why."""
    if not shutil.which("neuron-monitor"):
        return None, "not installed (aws-neuronx-tools)"
    proc, cfg = _start(config())
    try:
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        line = proc.stdout.readline() if ready and proc.stdout else ""
    finally:
        _end(proc, cfg)
    line = line.strip()
    try:
        report = json.loads(line)
    except ValueError:
        return None, f"no JSON report in {timeout_s:g} s" if not line else f"printed no JSON: {line[:200]!r}"
    return (report, "") if isinstance(report, dict) else (None, f"printed JSON that is not a report: {line[:200]!r}")


class Sampler:
    """neuron-monitor running for the length of a `with`, every line appended to `raw` (a file in the
    report folder) and parsed into `samples`. `problem` says why there are none."""

    def __init__(self, raw: Path):
        self.raw, self.samples, self.problem, self.unreadable = raw, [], "", 0
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        if not shutil.which("neuron-monitor"):
            self.problem = "neuron-monitor not installed (aws-neuronx-tools)"
            return self
        try:
            self._proc, self._cfg = _start(config())
        except OSError as exc:
            self.problem = f"neuron-monitor could not start: {exc}"
            return self
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        self.raw.parent.mkdir(parents=True, exist_ok=True)
        with open(self.raw, "w") as out:
            for line in self._proc.stdout:
                out.write(line)
                try:
                    doc = json.loads(line)
                except ValueError:
                    self.unreadable += 1
                    continue
                if isinstance(doc, dict):
                    self.samples.append(doc)
                else:
                    self.unreadable += 1

    def __exit__(self, *exc) -> None:
        if self._proc is None:
            return
        _end(self._proc, self._cfg)
        if self._thread:
            self._thread.join(10)
        if not self.samples:
            self.problem = f"neuron-monitor gave no readable report ({self.unreadable} unreadable line(s))"

    def summary(self) -> dict:
        return {"samples": len(self.samples), "unreadable": self.unreadable, "problem": self.problem} | summarise(
            self.samples
        )


def _dig(doc, *keys):
    for k in keys:
        doc = doc.get(k) if isinstance(doc, dict) else None
    return doc


def per_core_memory(report: dict) -> dict[str, dict[str, int]]:
    """core -> category -> bytes, summed over the runtimes of one report."""
    out: dict[str, dict[str, int]] = {}
    for rt in report.get("neuron_runtime_data") or []:
        cores = _dig(
            rt, "report", "memory_used", "neuron_runtime_used_bytes", "usage_breakdown", "neuroncore_memory_usage"
        )
        for core, cats in (cores or {}).items():
            if isinstance(cats, dict):
                mine = out.setdefault(str(core), dict.fromkeys(CATEGORIES, 0))
                for c in CATEGORIES:
                    value = cats.get(c, 0)
                    mine[c] += value if isinstance(value, int) else 0
    return out


def utilisation(report: dict) -> dict[str, float]:
    """core -> utilisation in percent in one report (the largest if two runtimes report a core)."""
    out: dict[str, float] = {}
    for rt in report.get("neuron_runtime_data") or []:
        cores = _dig(rt, "report", "neuroncore_counters", "neuroncores_in_use")
        for core, data in (cores or {}).items():
            value = _dig(data, "neuroncore_utilization")
            if isinstance(value, int | float):
                out[str(core)] = max(out.get(str(core), 0.0), float(value))
    return out


def summarise(samples: list[dict]) -> dict:
    """Per core: each category's peak over the samples, the peak total, and the utilisation's mean
    over the samples where the core was in use and its peak."""
    memory: dict[str, dict[str, int]] = {}
    for s in samples:
        for core, cats in per_core_memory(s).items():
            mine = memory.setdefault(core, dict.fromkeys(CATEGORIES, 0) | {"total": 0})
            for c in CATEGORIES:
                mine[c] = max(mine[c], cats[c])
            mine["total"] = max(mine["total"], sum(cats.values()))
    busy: dict[str, list[float]] = {}
    for s in samples:
        for core, u in utilisation(s).items():
            busy.setdefault(core, []).append(u)
    util = {c: {"mean": round(sum(u) / len(u), 1), "peak": round(max(u), 1)} for c, u in busy.items() if u}
    return {"memory": dict(sorted(memory.items())), "utilisation": dict(sorted(util.items()))}


def device_bytes_in_use(report: dict) -> int:
    """Device memory every running Neuron runtime holds, from one report."""
    total = 0
    for rt in report.get("neuron_runtime_data") or []:
        value = _dig(rt, "report", "memory_used", "neuron_runtime_used_bytes", "neuron_device")
        total += value if isinstance(value, int) else 0
    return total
