"""The project's own modules, found from the source tree."""

from __future__ import annotations

from pathlib import Path

from . import ROOT

PACKAGES = ("contract", "runtime", "gemma4_port")


def project_modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out
