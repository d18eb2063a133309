"""Reading a config file the project parses (artifact.json, a manifest, a checkpoint's config.json):
a missing or unparsable file is one line naming it, never a traceback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def read_parsed(path: Path, parse: Callable[[str], Any], error: type[Exception], missing: str,
                syntax: str, syntax_errors: tuple[type[Exception], ...] = (ValueError,)) -> Any:
    """`parse(path's text)`; `missing` is the whole message for an absent file, a parse failure is
    "PATH: not valid SYNTAX: why"."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise error(missing) from None
    try:
        return parse(text)
    except syntax_errors as exc:
        raise error(f"{path}: not valid {syntax}: {exc}") from None
