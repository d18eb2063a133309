"""The folder `build.py compile --out` writes: never someone else's files, never half an artifact.

A compile writes into a hidden sibling (`.NAME.compiling-PID`) and only a finished, self-tested
artifact is swapped in, with one atomic rename: a compile that fails or is killed at any point leaves
the previous artifact whole. The folder given may be absent, empty, or an artifact of this project
(artifact.json lists every file in it); anything else is refused before any work, so a mistyped
`--out` can never delete a user's files."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
from pathlib import Path

from contract.artifact import unlisted
from gemma4_port.compile.tracing import CompileError

PARTIAL = ".compiling-"  # infix of the sibling a compile writes into


def check_out(out: Path) -> None:
    """Refuse an `--out` that a compile may not replace."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise CompileError(f"--out {out}: not a folder; give an artifact folder (absent, empty, or an old artifact)")
    if not out.exists() or not any(out.iterdir()):
        return
    reason = _not_ours(out)
    if reason:
        raise CompileError(
            f"--out {out}: not empty and not an artifact of this project ({reason}); compile replaces only "
            "an absent or empty folder or an earlier artifact: choose another --out or empty it yourself"
        )


def _not_ours(folder: Path) -> str | None:
    """Why `folder` is not an artifact of ours (None when its artifact.json lists every file in it)."""
    try:
        files = json.loads((folder / "artifact.json").read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        held = ", ".join(repr(p.name) for p in sorted(folder.iterdir())[:3])
        return f"no readable artifact.json; it holds {held}"
    if not isinstance(files, dict):
        return "its artifact.json has no file list"
    extra = unlisted(folder, files)  # the loader's own rule: an artifact holds only what it lists
    return f"{extra[0]!r} is not listed in its artifact.json" if extra else None


def partial_folder(out: Path) -> Path:
    """A fresh sibling of `out` to compile into, on the same filesystem so the swap is a rename.
    Siblings left by compiles that were killed (their process is gone) are removed first."""
    out.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{out.name}{PARTIAL}"
    for stale in out.parent.glob(prefix + "*"):
        pid = stale.name.removeprefix(prefix).split(".")[0]  # also PID.old, see swap_in
        if pid.isdecimal() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = out.parent / f"{prefix}{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)  # this process's own earlier attempt
    tmp.mkdir()
    return tmp


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def swap_in(tmp: Path, out: Path) -> None:
    """Make the finished `tmp` the artifact at `out` in one step, then remove what was there."""
    if not out.exists() or not any(out.iterdir()):
        os.replace(tmp, out)  # onto nothing or an empty folder: rename(2) is atomic
        return
    check_out(out)  # still ours: nothing was planted while the compile ran
    if not _exchange(tmp, out):
        # No atomic exchange on this system: two renames, the old artifact kept aside in between.
        old = tmp.with_name(tmp.name + ".old")
        os.replace(out, old)
        os.replace(tmp, out)
        tmp = old
    shutil.rmtree(tmp)  # now the previous artifact


RENAME_EXCHANGE = 2  # linux/fs.h
AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))
