"""`planner bench solvers --problem placement` on tiny sizes: its JSON and
markdown, the placer against exhaustive enumeration, targets and bad input
(solve times are never asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.bench.solvers_placement import (
    BACKENDS,
    PConfig,
    _instance_runs,
    compare_baseline,
    evaluate_targets,
    trivial_bound_bytes,
)
from planner.bench.solvers_placement_instances import MIXES, make_instance
from planner.cli import main

# Limits far above what these tiny clusters need, so that proving them
# optimal does not depend on how loaded the machine is.
TINY = ["--gpus", "8,16", "--limits", "5,20", "--instances", "3"]


def test_bench_writes_json_and_markdown_section(tmp_path: Path) -> None:
    out = tmp_path / "placement.json"
    md = tmp_path / "benchmarks.md"
    md.write_text("# Benchmarks\n\nkept text\n", encoding="utf-8")
    code = main(["bench", "solvers", "--problem", "placement", *TINY,
                 "--backend", "cp-sat", "--backend", "exhaustive",
                 "--out", str(out), "--markdown", str(md)])  # fmt: skip
    assert code == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["bench"] == "solvers/placement"
    assert doc["command"].startswith("planner bench solvers --problem placement --gpus 8,16")
    assert [(c["gpus"], c["backend"]) for c in doc["cases"]] == [
        (8, "cp-sat"), (8, "exhaustive"), (16, "cp-sat"), (16, "exhaustive"),
    ]  # fmt: skip
    for c in doc["cases"]:
        assert c["n"] == 3
        # These tiny clusters are solved to optimality: no gap anywhere.
        assert c["proved_optimal"] == 3
        for e in c["limits"].values():
            if e["n"]:
                assert e["gap_to_best_bound_max"] == pytest.approx(0.0, abs=1e-9)
    by = {(c["gpus"], c["backend"]): c for c in doc["cases"]}
    for gpus in (8, 16):
        assert (
            by[gpus, "cp-sat"]["best_objective_gb"] == by[gpus, "exhaustive"]["best_objective_gb"]
        )
    assert [t["status"] for t in doc["targets"]] == ["NOT RUN"] * 3
    text = md.read_text(encoding="utf-8")
    assert "kept text" in text
    assert (
        "<!-- bench:solvers:placement -->" in text and "<!-- /bench:solvers:placement -->" in text
    )
    assert "## Solvers: AQUA's placer" in text
    assert "| 16 | cp-sat | 3 |" in text

    # The run against itself as a baseline: no objective regressed (the time
    # to 1 % is machine-dependent, so its factor is out of reach here).
    code = main(["bench", "solvers", "--problem", "placement", "--gpus", "16",
                 "--instances", "3", "--backend", "cp-sat", "--baseline", str(out),
                 "--regression-factor", "1e6"])  # fmt: skip
    assert code == 0


@pytest.mark.parametrize("index", range(3))
def test_placer_equals_exhaustive_on_tiny_instances(index: int) -> None:
    inst = make_instance(16, index, seed=5)
    config = PConfig(limits_s=(2.0,))
    exact = _instance_runs(inst, "exhaustive", config)
    found = _instance_runs(inst, "cp-sat", config)
    assert exact is not None and found is not None
    assert found["runs"][-1]["status"] == "OPTIMAL"
    assert found["runs"][-1]["objective_gb"] == pytest.approx(exact["runs"][0]["objective_gb"])
    assert trivial_bound_bytes(inst.inputs) / 1e9 <= exact["runs"][0]["objective_gb"] + 1e-9


def test_instances_are_seeded_and_cover_the_mixes() -> None:
    a = [make_instance(64, i, seed=1) for i in range(3)]
    b = [make_instance(64, i, seed=1) for i in range(3)]
    assert [x.inputs for x in a] == [y.inputs for y in b]
    assert [x.mix for x in a] == list(MIXES)
    for x in a:
        assert sum(m.shards for m in x.inputs.models) <= 64
        assert x.servers == 8
    producers = [sum(m.r_bytes > 0 for m in x.inputs.models) / x.models for x in a]
    assert producers[1] > producers[2]
    with pytest.raises(ValueError):
        make_instance(12, 0)


def test_targets_met_missed_and_fallback() -> None:
    def case(gpus: int, backend: str, limit: str, gap: float, used: str) -> dict:
        return {"gpus": gpus, "backend": backend, "limits": {limit: {
            "n": 1, "gap_to_best_bound_max": gap, "wall_s_max": 0.4,
            "backend_used": {used: 1}, "objective_gb_mean": 1.0}}}  # fmt: skip

    cases = [
        case(128, "gurobi", "5", 0.001, "cpsat"),
        case(128, "cp-sat", "0.5", 0.005, "cpsat"),
        case(1024, "cp-sat", "5", 0.2, "cpsat"),
    ]
    t = evaluate_targets(cases, {})
    assert [x["status"] for x in t] == ["MISSED", "MET", "MISSED"]
    assert "fell back to cpsat" in t[0]["detail"]
    t = evaluate_targets([], {"gurobi": "no licence"})
    assert t[0]["status"] == "NOT RUN" and t[0]["detail"] == "no licence"
    old = {"cases": [case(128, "cp-sat", "0.5", 0.005, "cpsat")]}
    worse = [case(128, "cp-sat", "0.5", 0.005, "cpsat")]
    worse[0]["limits"]["0.5"]["objective_gb_mean"] = 1.5
    worse[0]["time_to_1pct_s_max"] = None
    old["cases"][0]["time_to_1pct_s_max"] = None
    assert compare_baseline(worse, old, 2.0)["regressions"] == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["--gpus", "12"],
        ["--gpus", "x"],
        ["--limits", "0"],
        ["--backend", "bnb"],
    ],
)
def test_bad_input(argv: list[str]) -> None:
    try:
        code = main(["bench", "solvers", "--problem", "placement", *argv])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    assert "bnb" not in BACKENDS
