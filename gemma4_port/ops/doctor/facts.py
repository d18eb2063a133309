"""What the machine has, gathered once: the SDK wheels (and the framework wheels under them), the
Neuron apt packages, the host driver, the devices, `neuron-ls`, the host's RAM. A tool that is
missing, fails, hangs or prints something unreadable becomes a fact (`problems[tool]`), never a
traceback: the checks turn it into a line of the report."""

from __future__ import annotations

import glob
import importlib.metadata as md
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from contract.versions import SYSTEM_PACKAGES
from runtime.model.neuron_sdk import driver_version, system_package_version, wheel_versions

# The wheels the manifest pins exactly (checked), then the framework wheels they run on (recorded, and
# checked against constraints/neuron.txt where it pins them).
PINNED_WHEELS = (
    ("torch-neuronx", "torch_neuronx"),
    ("neuronx-cc", "neuronx_cc"),
    ("neuronx-distributed", "neuronx_distributed"),
)
RECORDED_WHEELS = ("torch", "torch-xla", "libneuronxla", "transformers")


@dataclass
class Machine:
    """The raw facts (tests give their own)."""

    wheels: dict[str, str]
    apt: dict[str, str | None]
    driver: str | None
    devices: list[str]
    neuron_ls: list[dict] | None  # `neuron-ls -j`; None when the tool is absent or failed (problems says why)
    env: dict[str, str]
    monitor: dict | None = None  # one `neuron-monitor` report before anything runs, None without one
    host_bytes: int = 0  # physical RAM
    problems: dict[str, str] = field(default_factory=dict)  # tool -> why it gave nothing

    @classmethod
    def here(cls) -> Machine:
        from gemma4_port.ops.doctor.monitor import monitor_once

        problems: dict[str, str] = {}

        def probe(name: str, fn: Callable[[], Any], default: Any) -> Any:
            try:
                return fn()
            except Exception as exc:  # noqa: BLE001 - any tool's failure is one report line, not a traceback
                problems[name] = f"{type(exc).__name__}: {exc}"
                return default

        listed, why = probe("neuron-ls", neuron_ls, (None, "failed"))
        if listed is None:
            problems.setdefault("neuron-ls", why)
        report, why = probe("neuron-monitor", monitor_once, (None, "failed"))
        if report is None:
            problems.setdefault("neuron-monitor", why)
        return cls(
            wheels=probe("wheels", lambda: wheel_versions(tuple(w for w, _ in PINNED_WHEELS) + RECORDED_WHEELS), {}),
            apt={p: probe(f"apt {p}", lambda p=p: system_package_version(p), None) for p in SYSTEM_PACKAGES},
            driver=probe("driver", driver_version, None),
            devices=probe("devices", lambda: sorted(glob.glob("/dev/neuron[0-9]*")), []),
            neuron_ls=listed,
            env=dict(os.environ),
            monitor=report,
            host_bytes=probe("host RAM", lambda: psutil.virtual_memory().total, 0),
            problems=problems,
        )


def neuron_ls(timeout_s: float = 60) -> tuple[list[dict] | None, str]:
    """`neuron-ls -j`'s device list, or None and why: absent, failing, hanging or not a JSON list."""
    if not shutil.which("neuron-ls"):
        return None, "not installed (aws-neuronx-tools)"
    try:
        done = subprocess.run(["neuron-ls", "-j"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return None, f"no answer in {timeout_s:g} s"
    except OSError as exc:
        return None, f"cannot run: {exc}"
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()[-300:]
        return None, f"exit {done.returncode}" + (f": {said}" if said else "")
    try:
        listed = json.loads(done.stdout)
    except ValueError:
        return None, f"printed no JSON: {done.stdout.strip()[:200]!r}"
    if not (isinstance(listed, list) and all(isinstance(d, dict) for d in listed)):
        return None, f"printed JSON that is not a device list: {done.stdout.strip()[:200]!r}"
    return listed, ""


def installed_distributions() -> list[str]:
    """Every installed distribution as name==version, sorted: the environment a report was made in."""
    return sorted({f"{d.metadata['Name']}=={d.version}" for d in md.distributions() if d.metadata["Name"]})
