"""Printing replay reports: when stdout is not a terminal (a pipe, a file, CI
logs) rich would wrap at 80 columns and cut the policies' columns, so the
console is made as wide as the table needs (its caption wraps within)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

# Widest console a piped report gets.
PIPE_WIDTH = 400


def print_table(table: Table, console: Console | None = None) -> None:
    """Print `table` on `console`, else on stdout, widened to fit when
    stdout is not a terminal."""
    out = console if console is not None else Console()
    if console is None and not out.is_terminal:
        caption, table.caption = table.caption, None
        needed = Console(width=PIPE_WIDTH).measure(table).maximum
        table.caption = caption
        if needed > out.width:
            out = Console(width=min(needed, PIPE_WIDTH))
    out.print(table)
