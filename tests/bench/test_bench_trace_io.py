"""`planner bench trace-io` end to end on a small file: both ways give the
same file and requests, and the table names every step."""

from __future__ import annotations

import pytest

from planner.cli import main


def test_trace_io_bench_small(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "trace-io", "--rows", "300", "--repeat", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert "same output both ways: yes" in out
    for step in ("import by columns", "load by columns", "import request by request"):
        assert f"| {step}" in out
