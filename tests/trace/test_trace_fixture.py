"""The bundled traces are what their documented commands generate, and the
default one has the shape replay expects of it."""

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


def documented_commands() -> dict[str, list[str]]:
    """Output file -> the README's `planner trace gen` command for it
    (backslash continuations joined)."""
    readme = (FIXTURES / "README.md").read_text(encoding="utf-8").replace("\\\n", " ")
    commands = {}
    for line in readme.splitlines():
        if line.startswith("planner trace gen "):
            args = shlex.split(line)[1:]  # without "planner"
            commands[args[args.index("-o") + 1]] = args
    return commands


def test_every_bundled_trace_has_its_command() -> None:
    bundled = {f"fixtures/traces/{p.name}" for p in FIXTURES.glob("*.jsonl")}
    assert set(documented_commands()) == bundled


@pytest.mark.parametrize("name", ["default.jsonl", "longctx.jsonl"])
def test_bundled_trace_is_reproducible(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = documented_commands()[f"fixtures/traces/{name}"]
    args[args.index("-o") + 1] = str(tmp_path / name)
    assert main(args) == 0
    capsys.readouterr()
    regenerated = (tmp_path / name).read_bytes()
    assert regenerated == (FIXTURES / name).read_bytes(), (
        f"fixtures/traces/{name} differs from what its README command generates "
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
