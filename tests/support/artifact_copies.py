"""Copies of compiled artifacts with one thing planted, for the tests that must see a failure."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from contract.artifact import write_raw


def resealed(folder: Path, edit) -> Path:
    """artifact.json edited in place and its digest made anew, so the edit reaches the check behind it."""
    raw = json.loads((folder / "artifact.json").read_text())
    raw.pop("digest")
    edit(raw)
    write_raw(folder, raw)
    return folder


def _edited(src: Path, dst: Path, edit) -> Path:
    """A copy with artifact.json edited and resealed."""
    shutil.copytree(src, dst)
    return resealed(dst, edit)


def with_wrong_golden(src: Path, dst: Path) -> Path:
    """A copy whose first golden step names another token as the reference's best: only the self-test
    can notice."""

    def edit(raw):
        golden = raw["golden"][0]
        wrong = next(t for t in range(raw["geometry"]["vocab"]) if t not in golden["steps"][0]["ids"])
        golden["tokens"][0] = golden["steps"][0]["ids"][0] = wrong

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


def with_rope_scaled(src: Path, dst: Path, factor: float, kind: str = "full") -> Path:
    """A copy whose rotary frequencies for one attention kind are off by `factor` (a wrong table or
    scaling rule that bends the logits without flipping a short greedy run)."""

    def edit(raw):
        rope = raw["geometry"]["rope"][kind]
        rope["inv_freq"] = [f * factor for f in rope["inv_freq"]]

    return _edited(src, dst, edit)


def with_golden_step(
    src: Path, dst: Path, prompt: int, step: int, ids: list[int], logits: list[float], token: int
) -> Path:
    """A copy whose golden prompt `prompt` stores other reference data at `step`."""

    def edit(raw):
        golden = raw["golden"][prompt]
        golden["tokens"][step] = token
        golden["steps"][step] = {"ids": ids, "logits": logits}

    return _edited(src, dst, edit)
