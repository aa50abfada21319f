"""`planner bench ledger` on a tiny run (pools of 3 and 7 producers, a real
server with a store file): every pool filled and timed, the crowding phase
run, JSON and the docs section written. Speed is never asserted."""

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
    argv = ["bench", "ledger", "--producers", "7,3", "--calls", "5", "--busy-clients", "1"]
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
