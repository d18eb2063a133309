"""The compile pipeline's artifact folder: `--out` never deletes what is not an artifact of this
project, and a compile interrupted at any point leaves the previous artifact whole."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import build
from contract.artifact import check_files, load_meta
from gemma4_port.compile.outdir import check_out, partial_folder, swap_in
from gemma4_port.compile.tracing import CompileError
from support import MANIFESTS, ROOT

TINY = MANIFESTS / "tiny-e2b.yaml"


def fake_artifact(folder, files: dict[str, str]):
    """A folder shaped like an artifact: the files, and an artifact.json listing them."""
    folder.mkdir()
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    (folder / "artifact.json").write_text(json.dumps({"format": 6, "files": {rel: "x" for rel in files}}))
    return folder


def test_compile_refuses_a_folder_that_is_not_an_artifact_and_leaves_it_alone(tmp_path, capsys):
    notes = tmp_path / "mine" / "notes.txt"
    notes.parent.mkdir()
    notes.write_text("a week of work")
    assert build.main(["compile", str(TINY), "--out", str(notes.parent)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: --out {notes.parent}: not empty and not an artifact of this project (")
    assert "'notes.txt'" in line
    assert notes.read_text() == "a week of work" and sorted(os.listdir(tmp_path)) == ["mine"]


def test_only_an_absent_or_empty_folder_or_an_artifact_of_ours_may_be_replaced(tmp_path, compiled):
    check_out(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    check_out(tmp_path / "empty")
    check_out(compiled("tiny-e2b", "fp32"))  # every file listed in its artifact.json

    art = fake_artifact(tmp_path / "art", {"graphs/a.pt": "g", "tokenizer/tokenizer.json": "{}"})
    check_out(art)
    (art / "tokenizer" / "notes.md").write_text("mine")
    with pytest.raises(CompileError, match=r"'tokenizer/notes.md' is not listed in its artifact.json"):
        check_out(art)

    (tmp_path / "file").write_text("x")
    with pytest.raises(CompileError, match="not a folder"):
        check_out(tmp_path / "file")
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    with pytest.raises(CompileError, match="not a folder"):
        check_out(tmp_path / "link")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "artifact.json").write_text("{not json")
    with pytest.raises(CompileError, match="no readable artifact.json; it holds 'artifact.json'"):
        check_out(tmp_path / "bad")


def test_the_finished_artifact_replaces_the_old_in_one_swap(tmp_path):
    old = fake_artifact(tmp_path / "art", {"graphs/old.pt": "old"})
    new = partial_folder(old)
    assert new.parent == old.parent and new.name.startswith(".art.compiling-")
    fake_artifact(new / "x", {})  # anything: swap_in moves the folder as it is
    swap_in(new, old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]  # the old one is gone, no sibling left
    assert sorted(os.listdir(old)) == ["x"]

    empty = tmp_path / "empty"
    empty.mkdir()
    new = partial_folder(empty)
    (new / "artifact.json").write_text("{}")
    swap_in(new, empty)
    assert os.listdir(empty) == ["artifact.json"]


def test_a_compile_killed_earlier_leaves_a_sibling_the_next_compile_removes(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".art.compiling-{int(dead.stdout)}"
    (stale / "graphs").mkdir(parents=True)
    running = tmp_path / f".art.compiling-{os.getppid()}"  # a live process's partial artifact stays
    running.mkdir()
    mine = partial_folder(tmp_path / "art")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, running.name])


def test_a_compile_killed_midway_leaves_the_old_artifact_whole_and_verifiable(tmp_path, compiled):
    art = tmp_path / "art"
    shutil.copytree(compiled("tiny-e2b", "fp32"), art)
    before = {p: p.read_bytes() for p in art.rglob("*") if p.is_file()}
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "build.py"), "compile", str(TINY), "--variant", "fp32", "--out", str(art)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".art.compiling-*/graphs/*")):  # the new graphs are being written
            assert proc.poll() is None and time.monotonic() < deadline, "the compile ended before it was killed"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert {p: p.read_bytes() for p in art.rglob("*") if p.is_file()} == before
    assert check_files(art, load_meta(art)) == []
