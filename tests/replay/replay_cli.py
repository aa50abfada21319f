"""`planner replay` run in process as a user runs it, for the CLI tests: a
trace file of rows, the exit status with what was printed, and the one line
a refusal writes."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from planner.cli import main


def write_trace(path: Path, rows: Sequence[Mapping[str, object]]) -> Path:
    """rows as a JSON-lines trace at path."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def replay(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`planner replay ARGS`: (exit status, stdout, stderr)."""
    code = main(["replay", *args])
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    """The single `planner replay: ...` line of a refusal's stderr."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("planner replay: ")
    return lines[0]
