"""The build commands' console, one policy for all of them: a pipe or a CI log has no width to
respect, so tables printed there are never squeezed below PIPE_WIDTH columns (a verify table cut to
`rand…` says nothing; the bench's widest table needs 170); a wider COLUMNS still widens them."""

from __future__ import annotations

from rich.console import Console

PIPE_WIDTH = 170


def console() -> Console:
    screen = Console()
    return screen if screen.is_terminal else Console(width=max(screen.width, PIPE_WIDTH))
