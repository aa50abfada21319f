"""`planner replay` run in process, for the replay CLI tests (with
planner_cli's write_trace)."""

from __future__ import annotations

import planner_cli
import pytest
from planner_cli import write_trace

__all__ = ["one_line", "replay", "write_trace"]


def replay(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`planner replay ARGS`: (exit status, stdout, stderr)."""
    return planner_cli.run_planner(capsys, "replay", *args)


def one_line(err: str) -> str:
    """The single `planner replay: ...` line of a refusal's stderr."""
    return planner_cli.one_line(err, "planner replay: ")
