"""Run code against the Neuron SDK stand-in (tests/support/neuron_sdk) in a process of its own.

The stand-in is never imported into the test session: there `torch_neuronx` must stay absent (the
hardware tests skip on it, the loader's version check reads the installed wheels). A child process
gets it first on PYTHONPATH, as a machine with the SDK installed would have the real one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from . import ROOT

STANDIN = Path(__file__).resolve().parent / "neuron_sdk"
MARK = "RESULT "


def sdk_env(**extra: str) -> dict[str, str]:
    return os.environ | {"PYTHONPATH": os.pathsep.join([str(STANDIN), str(ROOT)]), "OMP_NUM_THREADS": "1"} | extra


def run_cli(*args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    """`build.py ARGS` with the stand-in SDK installed."""
    return subprocess.run(
        [sys.executable, str(ROOT / "build.py"), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=sdk_env(COLUMNS="200", **env),
        timeout=timeout,
    )


def run_python(code: str, *args, timeout: float = 600, **env: str):
    """Run `code` (argv = args) with the stand-in; it reports by calling `report(value)` once; returns value."""
    prelude = f"import json, sys\ndef report(value):\n    print({MARK!r} + json.dumps(value), flush=True)\n"
    done = subprocess.run(
        [sys.executable, "-c", prelude + code, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=sdk_env(**env),
        timeout=timeout,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    if done.returncode != 0 or not lines:
        raise AssertionError(
            f"the child failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
        )
    return json.loads(lines[-1][len(MARK) :])
