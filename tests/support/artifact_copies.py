"""Copies of compiled artifacts with one thing planted, for the tests that must see a failure."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def _edited(src: Path, dst: Path, edit) -> Path:
    """artifact.json is not among the sha256-checked files, so an edited copy still loads."""
    shutil.copytree(src, dst)
    raw = json.loads((dst / "artifact.json").read_text())
    edit(raw)
    (dst / "artifact.json").write_text(json.dumps(raw))
    return dst


def with_wrong_golden(src: Path, dst: Path) -> Path:
    """A copy whose first golden token is wrong: only the self-test can notice."""
    def edit(raw):
        tokens = raw["golden"][0]["tokens"]
        tokens[0] = (tokens[0] + 1) % raw["geometry"]["vocab"]

    return _edited(src, dst, edit)


def with_eos(src: Path, dst: Path, token: int) -> Path:
    """A copy that also ends generation at `token` (a random model hardly ever samples its real EOS)."""
    def edit(raw):
        raw["eos_token_ids"] = sorted({*raw["eos_token_ids"], token})

    return _edited(src, dst, edit)


def with_backend(src: Path, dst: Path, backend: str) -> Path:
    """A copy that says it was compiled for `backend` (the graphs stay what they are)."""
    def edit(raw):
        raw["backend"] = backend

    return _edited(src, dst, edit)
