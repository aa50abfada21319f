"""The console replay reports print to: when stdout is not a terminal (a pipe,
a file, CI logs) rich would wrap at 80 columns and cut the policies' columns,
so it is made wide enough for a table of several policies."""

from __future__ import annotations

from rich.console import Console

PIPE_WIDTH = 200


def report_console() -> Console:
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, PIPE_WIDTH))
    return console
