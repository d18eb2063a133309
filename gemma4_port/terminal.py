"""The build commands' console: a pipe or a CI log has no width to respect, so tables printed there
are not squeezed into 80 columns (a verify table cut to `rand…` says nothing)."""

from __future__ import annotations

from rich.console import Console

PIPE_WIDTH = 160


def console() -> Console:
    screen = Console()
    return screen if screen.is_terminal else Console(width=PIPE_WIDTH)
