"""Copies of compiled artifacts with one thing planted, for the tests that must see a failure."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def with_wrong_golden(src: Path, dst: Path) -> Path:
    """A copy whose first golden token is wrong. artifact.json is not among the sha256-checked files,
    so the artifact still loads: only the self-test can notice."""
    shutil.copytree(src, dst)
    raw = json.loads((dst / "artifact.json").read_text())
    tokens = raw["golden"][0]["tokens"]
    tokens[0] = (tokens[0] + 1) % raw["geometry"]["vocab"]
    (dst / "artifact.json").write_text(json.dumps(raw))
    return dst
