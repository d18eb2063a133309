"""`build.py` as a user runs it: a fresh process from the checkout."""

from __future__ import annotations

import os
import subprocess
import sys

from . import ROOT


def build_py(*args: str, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "build.py"), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=os.environ | {"COLUMNS": "250"},
        timeout=timeout,
        **kw,
    )


def verify(folder, *extra: str) -> subprocess.CompletedProcess:
    """`build.py verify` in a fresh process, exactly as the server loads the artifact."""
    return build_py("verify", folder, *extra)
