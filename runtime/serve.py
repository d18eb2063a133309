"""`build.py serve DIR` and `python -m runtime.serve` (containers): check the settings and the
artifact, then become gunicorn (exec: signals such as SIGTERM go straight to it)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

from .artifact import ArtifactError, load_meta
from .settings import ENV, Settings, SettingsError, check_backend

CONFIG = Path(__file__).with_name("gunicorn.conf.py")


def gunicorn_argv() -> list[str]:
    return [sys.executable, "-m", "gunicorn", "-c", str(CONFIG), "runtime.wsgi:app"]


def run(environ: Mapping[str, str]) -> NoReturn:
    """Validate once here, so a bad variable or artifact is one line and exit 2, not a worker crash."""
    settings = Settings.from_env(environ)
    check_backend(settings, load_meta(settings.artifact).backend)
    # One engine thread owns the device; torch's default intra-op pool stalls on a busy small host
    # (measured up to 10x slower on 2 vCPUs), so one thread unless the operator says otherwise.
    env = {"OMP_NUM_THREADS": "1"} | dict(environ) | settings.to_env()
    os.execve(sys.executable, gunicorn_argv(), env)


def serve(folder: Path, host: str, port: int, backend: str) -> int:
    overrides = {ENV["artifact"]: str(Path(folder).resolve()), ENV["host"]: host, ENV["port"]: str(port),
                 ENV["backend"]: backend}
    run(os.environ | overrides)


def main() -> int:
    try:
        run(os.environ)
    except (ArtifactError, SettingsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
