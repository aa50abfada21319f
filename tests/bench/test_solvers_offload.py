"""`planner bench solvers --problem offload` on tiny sizes: the structure of
its JSON and markdown, bnb against exhaustive enumeration, bad input (solve
times are never asserted)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from planner.solvers import Status

from planner.bench.solvers_offload import (
    _run_bnb,
    _run_exhaustive,
    command_line,
    config_from,
    evaluate_targets,
)
from planner.bench.solvers_offload_instances import PRESSURES, make_instance
from planner.cli import build_parser, main

TINY = ["--sizes", "3x8,2x12", "--instances", "4", "--pruning-instances", "2"]


def test_bench_writes_json_and_markdown_section(tmp_path: Path) -> None:
    out = tmp_path / "solvers.json"
    md = tmp_path / "benchmarks.md"
    md.write_text("# Benchmarks\n\nkept text\n", encoding="utf-8")
    code = main(["bench", "solvers", "--problem", "offload", *TINY,
                 "--backend", "bnb", "--backend", "exhaustive",
                 "--out", str(out), "--markdown", str(md)])  # fmt: skip
    assert code == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["bench"] == "solvers/offload"
    assert doc["command"].startswith("planner bench solvers --problem offload --sizes 3x8,2x12")
    assert "cpu_model" in doc["machine"]
    keys = [(c["requests"], c["layers"], c["backend"]) for c in doc["cases"]]
    assert keys == [(3, 8, "bnb"), (3, 8, "exhaustive"), (2, 12, "bnb"), (2, 12, "exhaustive")]
    for case in doc["cases"]:
        assert case["n"] == 4
        assert sum(case["statuses"].values()) == 4
        assert set(case["by_pressure"]) == set(PRESSURES)
        assert case["p50_ms"] <= case["p99_ms"] <= case["max_ms"]
        # bnb proves the optimum of these tiny instances: always the exhaustive one.
        assert case["vs_exhaustive"]["identical"] == case["vs_exhaustive"]["compared"] == 4
    bnb = [c for c in doc["cases"] if c["backend"] == "bnb"]
    # Sizes without a target get the default limit.
    assert all(c["time_limit_ms"] == 10 for c in bnb)
    assert [p["requests"] for p in doc["pruning"]] == [3, 2]
    assert not [a for a in doc["anomalies"] if a["kind"] != "time limit"]
    text = md.read_text(encoding="utf-8")
    assert "kept text" in text
    assert "<!-- bench:solvers:offload -->" in text and "<!-- /bench:solvers:offload -->" in text
    assert "## Solvers: the layer-offload ILP" in text
    assert "| 3x8 | bnb | 4 | 10 |" in text


@pytest.mark.parametrize("index", range(8))
def test_bnb_equals_exhaustive_on_tiny_instances(index: int) -> None:
    inst = make_instance(3, 10, index, seed=7)
    assert inst.problem.enumeration_size() <= 20_000
    exact = _run_exhaustive(inst)
    found = _run_bnb(inst, 5.0)
    assert found.status == exact.status
    if exact.objective is None:
        assert found.objective is None
    else:
        assert found.objective == pytest.approx(exact.objective, rel=1e-12)
    if inst.pressure == "infeasible":
        assert exact.status == Status.INFEASIBLE.value
    if inst.pressure == "fits":
        # Nothing offloaded: the step is its compute alone.
        assert exact.objective == pytest.approx(inst.step_compute_s, rel=1e-12)


def test_the_command_line_reproduces_the_options_given() -> None:
    argv = ["bench", "solvers", "--problem", "offload", "--instances", "7",
            "--time-limit", "0.25", "--max-enumeration", "3000000", "--seed", "3"]  # fmt: skip
    args = build_parser().parse_args(argv)
    command = command_line(args, config_from(args))
    assert command == (
        "planner bench solvers --problem offload --instances 7 --time-limit 0.25 "
        "--max-enumeration 3000000 --seed 3"
    )
    again = build_parser().parse_args(command.split()[1:])
    assert config_from(again) == config_from(args)


def test_instances_are_seeded() -> None:
    a, b = make_instance(4, 16, 2, seed=3), make_instance(4, 16, 2, seed=3)
    assert a.budget == b.budget and (a.blocks == b.blocks).all()
    assert make_instance(4, 16, 2, seed=4).budget != a.budget


def test_baseline_comparison_and_regression_exit(tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    args = ["bench", "solvers", "--sizes", "2x8", "--instances", "4", "--backend", "bnb",
            "--pruning-instances", "0"]  # fmt: skip
    assert main([*args, "--out", str(out)]) == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    for case in doc["cases"]:
        case["p50_ms"] /= 1000.0  # an impossibly fast baseline
    out.write_text(json.dumps(doc), encoding="utf-8")
    assert main([*args, "--baseline", str(out)]) == 1


@pytest.mark.parametrize(
    "bad",
    [
        ["--sizes", "4"],
        ["--sizes", "4x1"],
        ["--sizes", "ax32"],
        ["--instances", "0"],
        ["--time-limit", "0"],
        ["--time-limit", "nan"],
        ["--backend", "simplex"],
        ["--problem", "rotation"],
    ],
)
def test_bad_arguments_exit_with_usage_error(
    bad: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "solvers", *bad])
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_bad_option_values_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "solvers", "--slack-ms", "-1"]) == 2
    assert "--slack-ms" in capsys.readouterr().err
    missing = tmp_path / "missing.json"
    assert main(["bench", "solvers", "--baseline", str(missing)]) == 2
    assert "cannot read baseline" in capsys.readouterr().err


def test_4x32_has_a_quality_target_only() -> None:
    def case(requests: int, layers: int, excess: float) -> dict[str, Any]:
        cls = {"p99_ms": 30.0, "cpu_p99_ms": 29.0}
        return {
            "requests": requests,
            "layers": layers,
            "backend": "bnb",
            "p99_ms": 30.0,
            "cpu_p99_ms": 29.0,
            "over_limit": 0,
            "by_pressure": {"tight": cls},
            "vs_best": {"excess_stall_pct_of_step_max": excess, "no_plan": 0},
        }

    small, mid = evaluate_targets([case(4, 32, 0.5), case(16, 32, 1.5)])
    assert (small["size"], small["p99_status"], small["quality_status"]) == ("4x32", "none", "met")
    assert (mid["size"], mid["p99_status"], mid["quality_status"]) == ("16x32", "missed", "missed")
