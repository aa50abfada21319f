"""`planner bench ledger` on a tiny run (pools of 3 and 7 producers, a real
server with a store file): every pool filled and timed, the crowding phase
run, JSON and the docs section written; then the write phase with 1 and 2
replicas on the test's PostgreSQL next to SQLite. Speed is never
asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.bench.ledger import SECTION
from planner.cli import main


def test_a_tiny_ledger_bench_writes_every_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ledger.json"
    markdown = tmp_path / "benchmarks.md"
    argv = [
        "bench",
        "ledger",
        "--producers",
        "7,3",
        "--calls",
        "5",
        "--busy-clients",
        "1",
        "--replicas",
        "none",
    ]
    assert main([*argv, "--out", str(out), "--markdown", str(markdown)]) == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["bench"] == "ledger"
    assert report["command"].startswith("planner bench ledger --producers 3,7 --calls 5")
    assert [p["producers"] for p in report["pools"]] == [3, 7]
    for pool in report["pools"]:
        for kind in ("offer", "allocate"):
            stats = pool[kind]
            assert stats["calls"] == 5
            assert 0 < stats["min_ms"] <= stats["p50_ms"] <= stats["p99_ms"] <= stats["max_ms"]
    crowd = report["crowding"]
    assert (crowd["quiet_producers"], crowd["busy_producers"], crowd["busy_clients"]) == (3, 7, 1)
    assert crowd["quiet_offer"]["calls"] == 5
    text = markdown.read_text(encoding="utf-8")
    assert f"<!-- bench:{SECTION} -->" in text
    assert "| 7 |" in text
    assert "producers in pool" in capsys.readouterr().out


def test_the_write_phase_runs_sqlite_and_each_replica_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], postgresql_url: str
) -> None:
    out = tmp_path / "ledger.json"
    markdown = tmp_path / "benchmarks.md"
    argv = ["bench", "ledger", "--producers", "2", "--calls", "2", "--replicas", "1,2"]
    argv += ["--write-clients", "2", "--write-duration-s", "0.5", "--postgresql", postgresql_url]
    assert main([*argv, "--out", str(out), "--markdown", str(markdown)]) == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    assert "--postgresql postgresql://planner:***@127.0.0.1:" in report["command"]
    assert "planner-local-secret" not in out.read_text(encoding="utf-8")
    assert report["writes_postgresql_left_out"] is None
    cases = [(w["store"], w["replicas"], w["clients"]) for w in report["writes"]]
    assert cases == [("sqlite", 1, 2), ("postgresql", 1, 2), ("postgresql", 2, 2)]
    for w in report["writes"]:
        assert w["calls"] > 0 and w["failed"] == 0
        assert w["calls_per_s"] == pytest.approx(w["calls"] / 0.5)
    text = markdown.read_text(encoding="utf-8")
    assert "### Writes with replicas" in text and "| PostgreSQL | 2 | 2 |" in text
    assert "writes/s" in capsys.readouterr().out
