"""`planner ...` run in process as a user runs it, for the CLI tests of
every folder: the exit status with what was printed, the single line a
refusal writes, and a JSON-lines trace file to run on."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from planner.cli import main


def run_planner(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`planner ARGV`: (exit status, stdout, stderr)."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str, prefix: str = "") -> str:
    """The single line of a refusal's stderr, which starts with prefix."""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), err
    return lines[0]


def write_trace(path: Path, rows: Sequence[Mapping[str, object]]) -> Path:
    """rows as a JSON-lines trace at path."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path
