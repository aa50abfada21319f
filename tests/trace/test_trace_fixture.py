"""The bundled default trace is what its documented command generates, and
has the shape replay expects of it."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from planner.cli import main
from planner.trace import load_trace
from planner.trace.stats import compute_stats

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = REPO_ROOT / "fixtures" / "traces"
DEFAULT = FIXTURES / "default.jsonl"


def documented_command() -> list[str]:
    readme = (FIXTURES / "README.md").read_text(encoding="utf-8")
    lines = [line for line in readme.splitlines() if line.startswith("planner trace gen ")]
    assert len(lines) == 1, "fixtures/traces/README.md must show one generation command"
    return shlex.split(lines[0])[1:]  # without "planner"


def test_default_trace_is_reproducible(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = documented_command()
    out = args.index("-o")
    assert args[out + 1] == "fixtures/traces/default.jsonl"
    args[out + 1] = str(tmp_path / "default.jsonl")
    assert main(args) == 0
    capsys.readouterr()
    regenerated = (tmp_path / "default.jsonl").read_bytes()
    assert regenerated == DEFAULT.read_bytes(), (
        "fixtures/traces/default.jsonl differs from what its README command generates "
        "(a numpy change of the random streams?); regenerate it with that command"
    )


def test_default_trace_shape() -> None:
    requests = load_trace(DEFAULT)
    stats = compute_stats(requests)
    assert stats.last_arrival_s < 120.0
    assert stats.mean_rate_rps == pytest.approx(10.0, rel=0.05)
    assert stats.interarrival_cv == pytest.approx(1.0, abs=0.1)
    assert 1500 < stats.prompt.mean < 3000 and 300 < stats.output.mean < 600
    assert [r.id for r in requests[:3]] == ["r0", "r1", "r2"]
