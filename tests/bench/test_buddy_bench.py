"""`planner bench policies --policy buddy` on a tiny configuration: the
timing rows, the greedy-vs-exact gap (greedy never better), the markdown
section, and the options that do not apply refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.bench import buddy
from planner.cli import main
from planner.domain.cluster import ClusterInputs, Instance, Strategy, ThroughputProfile
from planner.policies.buddy import configuration_cost, plan_buddy_groups


def test_tiny_run_report_and_markdown() -> None:
    config = buddy.BuddyBenchConfig(sizes=(8, 16), calls=5, warmup=1, gap_trials=60)
    report = buddy.run(config, "planner bench policies --policy buddy")
    assert {(r["instances"], r["strategy"]) for r in report["timing"]} == {
        (n, s)
        for n in (8, 16)
        for s in ("throughput-greedy, warm", "throughput-greedy, cold", "memory-greedy", "exact")
    }
    for r in report["timing"]:
        assert r["calls"] == 5 and r["p50_ms"] > 0
    assert report["target"] is None  # 1,024 not measured
    gap = report["gap"]
    assert gap["greedy_beat_exact"] == 0
    assert gap["compared"] + gap["skipped_unmet"] == 60
    assert gap["gap_mean"] >= 0
    text = buddy.text_report(report)
    assert "throughput-greedy" in text
    section = buddy.markdown_section(report)
    assert section.startswith("## Buddy groups") and "| instances |" in section


def test_greedy_matches_exact_on_a_linear_profile() -> None:
    # Thpt_g(g) = g (no pipeline loss): any covering configuration is
    # optimal, so the greedy's gap is zero.

    profile = ThroughputProfile(tuple(float(g) for g in range(1, 9)))
    inst = tuple(Instance(id=str(i)) for i in range(20))
    costs = [
        configuration_cost(
            plan_buddy_groups(
                ClusterInputs(inst, 10, 32, profile, required_bytes=55, strategy=s)
            ).group_sizes(),
            profile,
        )
        for s in (Strategy.THROUGHPUT_GREEDY, Strategy.EXACT)
    ]
    assert costs[0] == pytest.approx(costs[1])


def test_cli_refuses_rotation_options(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["bench", "policies", "--policy", "buddy", "--baseline", str(tmp_path / "x")])
    assert code == 2
    assert "--baseline" in capsys.readouterr().err
    code = main(["bench", "policies", "--policy", "buddy", "--sizes", "10"])
    assert code == 2


def test_cli_writes_json_and_markdown(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = buddy.BuddyBenchConfig(sizes=(8,), calls=3, warmup=1, gap_trials=10)
    monkeypatch.setattr(buddy, "BuddyBenchConfig", lambda **kw: small)
    out, md = tmp_path / "b.json", tmp_path / "b.md"
    code = main(
        ["bench", "policies", "--policy", "buddy", "--out", str(out), "--markdown", str(md)]
    )
    assert code == 0
    assert json.loads(out.read_text())["bench"] == "policies/buddy"
    assert "<!-- bench:policies:buddy -->" in md.read_text()
