"""`planner bench replay` on a tiny workload: the JSON and markdown it writes
(speed itself is never asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main


def test_bench_replay_writes_json_and_its_markdown_section(tmp_path: Path) -> None:
    out = tmp_path / "replay.json"
    md = tmp_path / "benchmarks.md"
    md.write_text("# Benchmarks\n\nkept text\n", encoding="utf-8")
    code = main(
        ["bench", "replay", "--no-azure", "--rate", "2", "--duration", "5",
         "--cluster-requests", "40", "--cluster-policy", "replication",
         "--serverless-requests", "60", "--serverless-policy", "dedicated",
         "--out", str(out), "--markdown", str(md)]
    )  # fmt: skip
    assert code == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["bench"] == "replay/speed"
    assert [(c["topology"], c["policy"]) for c in doc["cases"]] == [
        ("single engine", "fcfs"),
        ("single engine", "lvf"),
        ("cluster", "replication"),
        ("serverless", "dedicated"),
    ]
    assert doc["cases"][2]["requests"] == 40
    assert doc["cases"][3]["requests"] == 60
    assert "--cluster-requests 40" in doc["command"]
    assert "--serverless-requests 60" in doc["command"]
    for case in doc["cases"]:
        assert case["requests"] > 0 and case["iterations"] > 0
        assert case["simulated_s"] > 0 and case["wall_s"] > 0 and case["cpu_s"] > 0
        assert case["simulated_s_per_wall_s"] == case["simulated_s"] / case["wall_s"]
    text = md.read_text(encoding="utf-8")
    assert "kept text" in text
    assert "<!-- bench:replay:speed -->" in text and "## Replay simulator speed" in text
    assert text.count("| generated: 2 RPS Poisson, 5 s, sharegpt lengths |") == 2
    cluster_row = "| cluster of 4 instances, 1 GB KV each: fixtures/traces/default.jsonl, first 40"
    assert text.count(cluster_row) == 1
    assert text.count("| serverless, 3 MIG slices: generated multi-tenant trace, 8 models") == 1


def test_bench_replay_rejects_a_non_positive_cluster_size(capsys: object) -> None:
    assert main(["bench", "replay", "--no-azure", "--cluster-requests", "0"]) == 2
    assert main(["bench", "replay", "--no-azure", "--serverless-requests", "0"]) == 2


def test_bench_replay_rejects_a_non_positive_rate(capsys: object) -> None:
    assert main(["bench", "replay", "--no-azure", "--rate", "0"]) == 2


def test_bench_replay_names_a_workload_with_no_arrival(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["bench", "replay", "--no-azure", "--no-cluster", "--no-serverless", "--rate", "1",
         "--duration", "1"]
    )  # fmt: skip
    assert code == 2
    assert "--duration" in capsys.readouterr().err
