"""Gemma-4 on Inferentia2: the device-graph port and its build tools."""

from __future__ import annotations

import os
from pathlib import Path

# The folder that holds the contract, runtime and gemma4_port packages: a checkout of the source tree,
# or site-packages when the package is installed from its wheel. Only `checkout()` says which.
ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = Path(__file__).resolve().parent / "manifests"  # the shipped manifests (package data)


def checkout() -> Path | None:
    """The source tree these packages run from (pyproject.toml and build.py beside them), or None when
    they are installed (a wheel carries the packages only)."""
    return ROOT if (ROOT / "pyproject.toml").is_file() and (ROOT / "build.py").is_file() else None


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a child Python process that imports these packages, from whatever folder it
    runs in: ROOT first on its path (a checkout need not be installed; site-packages is there anyway),
    unless the path already names it: then its order stands (the slim image puts its server's folder
    before the base's, whose runtime/ holds only the load path: images/entrypoint.sh)."""
    env = dict(os.environ if env is None else env)
    given = env.get("PYTHONPATH", "")
    if str(ROOT) not in given.split(os.pathsep):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), given) if p)
    return env
