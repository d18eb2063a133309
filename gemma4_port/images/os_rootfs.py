"""The default OS image's root filesystem: a minimal Debian bookworm with its Python, made once with debootstrap
(no registry needed) and cached as a tarball for the Docker engine to import."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from rich.console import Console

from gemma4_port.images.spec import ImageError

DEBIAN_MIRROR = "http://deb.debian.org/debian"
# Debian's Python must be inside the OS image: builds have no network to apt-get it later.
DEBOOTSTRAP_INCLUDE = ("python3", "python3-venv", "ca-certificates")


def debian_rootfs(cache: Path, console: Console) -> Path:
    """A minimal Debian bookworm root filesystem as a tarball, made once and cached."""
    tarball = cache / "debian-bookworm-minbase.tar"
    if tarball.is_file():
        return tarball
    if shutil.which("debootstrap") is None:
        raise ImageError("prepare OS image: debootstrap is not installed (apt-get install debootstrap)")
    cache.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="rootfs.", dir=cache))
    try:
        with console.status("debootstrap bookworm (minbase + python3), once; ~1-2 min"):
            run = subprocess.run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={','.join(DEBOOTSTRAP_INCLUDE)}",
                    "bookworm",
                    str(root),
                    DEBIAN_MIRROR,
                ],
                capture_output=True,
                text=True,
            )
        if run.returncode:
            last = (run.stdout + run.stderr).strip().splitlines()[-1:] or ["no output"]
            raise ImageError(f"prepare OS image: debootstrap failed: {last[0]}")
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):  # ~100 MB the image does not need
            for f in (root / leftover).glob("*"):
                if f.is_file():
                    f.unlink()
        partial = tarball.with_suffix(".partial")
        subprocess.run(
            ["tar", "--numeric-owner", "--one-file-system", "-C", str(root), "-cf", str(partial), "."], check=True
        )
        partial.rename(tarball)
    finally:
        subprocess.run(["umount", "-R", str(root / "proc"), str(root / "sys")], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
    return tarball
