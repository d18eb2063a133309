"""Reading a config file the project parses (artifact.json, a manifest, a checkpoint's config.json):
a missing or unparsable file is one line naming it, never a traceback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def read_parsed(
    path: Path,
    parse: Callable[[str], Any],
    error: type[Exception],
    missing: str,
    syntax: str,
    syntax_errors: tuple[type[Exception], ...] = (ValueError,),
) -> Any:
    """`parse(path's text)`; `missing` is the whole message for an absent file, a parse failure is
    "PATH: not valid SYNTAX: why"."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise error(missing) from None
    except IsADirectoryError:
        raise error(f"{path} is a directory; give the file itself") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{path}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        return parse(text)
    except syntax_errors as exc:
        raise error(f"{path}: not valid {syntax}: {_where(exc)}") from None


def _where(exc: Exception) -> str:
    """A parser's complaint in one line; YAML's says where by line and column (its own text names
    the input "<unicode string>", not the file, over several lines)."""
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        context = getattr(exc, "context", None)
        where = f" ({context})" if context else ""
        return f"line {mark.line + 1}, column {mark.column + 1}: {getattr(exc, 'problem', exc)}{where}"
    return " ".join(str(exc).split())
