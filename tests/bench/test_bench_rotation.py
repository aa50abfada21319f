"""`planner bench policies --policy rotation`: the machinery at a tiny size,
in process. No timing assertions: speed is what the bench reports, not what
tests check (DESIGN.md §7)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.bench.baseline import compare
from planner.bench.markdown import begin_marker, end_marker, replace_section
from planner.bench.proto_request import plan_rotation_request
from planner.bench.results import results_from_json
from planner.bench.rotation import build_case
from planner.bench.server_process import parse_address
from planner.bench.synthetic import WorkloadMix, generate
from planner.cli import main
from planner.domain.requests import RequestState
from planner.policies.rotation import plan_rotation

SECTION = "policies:rotation"
OTHER = "solvers:placement"


def _bytes(n: int, seed: int, block_level: bool = False) -> bytes:
    request = plan_rotation_request(generate(n, seed, block_level=block_level))
    return request.SerializeToString(deterministic=True)


@pytest.mark.parametrize("block_level", [False, True])
def test_synthetic_snapshots_are_deterministic_for_a_seed(block_level: bool) -> None:
    assert _bytes(200, 7, block_level) == _bytes(200, 7, block_level)
    assert _bytes(200, 7, block_level) != _bytes(200, 8, block_level)


@pytest.mark.parametrize("n", [20, 200, 2000])
@pytest.mark.parametrize("block_level", [False, True])
def test_synthetic_snapshots_are_under_contention(n: int, block_level: bool) -> None:
    synthetic = generate(n, 0, block_level=block_level)
    mix = WorkloadMix()
    states = [r.state for r in synthetic.requests]
    assert len(states) == n
    assert states.count(RequestState.RUNNING) == round(n * mix.running_fraction)
    assert states.count(RequestState.WAITING) == round(n * mix.waiting_fraction)
    assert states.count(RequestState.ROTARY) > 0
    assert synthetic.free_gpu_blocks < synthetic.blocks_needed()

    plan = plan_rotation(synthetic.snapshot(), synthetic.inputs())
    # Largest-VLT-First ran, not the no-contention FCFS fallback, and it had
    # to both prioritize and preempt.
    assert not plan.fcfs_fallback
    assert plan.explanation.blocks_needed == synthetic.blocks_needed()
    assert plan.prioritized and plan.preempted
    assert plan.explanation.transfer_budget_blocks == mix.transfer_budget_blocks
    if block_level:
        assert plan.moves and plan.batches


def test_block_level_snapshot_gives_every_block_one_owner() -> None:
    synthetic = generate(300, 3, block_level=True)
    assert synthetic.pools is not None
    gpu = list(synthetic.pools.free_gpu_block_ids)
    cpu = list(synthetic.pools.free_cpu_block_ids)
    for r in synthetic.requests:
        gpu += r.gpu_block_ids
        cpu += r.cpu_block_ids
        if r.state == RequestState.RUNNING:
            assert len(r.gpu_block_ids) == r.gpu_blocks
            assert len(r.cpu_block_ids) == r.synced_blocks
        if r.state == RequestState.ROTARY:
            assert len(r.cpu_block_ids) == r.cpu_blocks
    assert sorted(gpu) == list(range(len(gpu)))
    assert sorted(cpu) == list(range(len(cpu)))
    assert len(synthetic.pools.free_gpu_block_ids) == synthetic.free_gpu_blocks


@pytest.mark.parametrize("block_level", [False, True])
def test_every_path_measures_the_same_decision(block_level: bool) -> None:
    # build_case raises when a proto encoding and the domain snapshot plan
    # differently.
    case = build_case(60, 1, block_level, WorkloadMix())
    assert set(case.requests) == ({"rows"} if block_level else {"rows", "columns"})
    assert not case.plan.fcfs_fallback


def _run(tmp_path: Path, *extra: str) -> tuple[int, Path, Path]:
    out, md = tmp_path / "bench" / "rotation.json", tmp_path / "benchmarks.md"
    rc = main(
        [
            "bench",
            "policies",
            "--policy",
            "rotation",
            "--sizes",
            "30",
            "--block-level-sizes",
            "20",
            "--calls",
            "3",
            "--warmup",
            "1",
            "--no-grpc",
            "--out",
            str(out),
            "--markdown",
            str(md),
            *extra,
        ]
    )
    return rc, out, md


def test_bench_writes_json_and_its_markdown_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    md = tmp_path / "benchmarks.md"
    other = f"{begin_marker(OTHER)}\n## Placement solver\nkept as is\n{end_marker(OTHER)}"
    md.write_text(f"# Benchmarks\n\nIntro.\n\n{other}\n", encoding="utf-8")

    rc, out, md = _run(tmp_path)
    assert rc == 0
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["bench"] == "policies/rotation"
    assert data["command"].startswith("planner bench policies --policy rotation --sizes 30")
    for key in ("cpu_model", "logical_cores", "python", "numpy", "grpcio", "protobuf", "git"):
        assert key in data["machine"]
    assert data["config"]["seed"] == 0
    keys = {(r["level"], r["requests"], r["path"], r["form"]) for r in data["results"]}
    assert keys == {
        ("counts", 30, "policy", "domain"),
        ("counts", 30, "rpc", "columns"),
        ("counts", 30, "rpc", "rows"),
        ("block", 20, "policy", "domain"),
        ("block", 20, "rpc", "rows"),
    }
    for r in data["results"]:
        assert r["calls"] == 3
        assert 0 < r["min_ms"] <= r["p50_ms"] <= r["p99_ms"] <= r["max_ms"]
        assert r["min_ms"] <= r["mean_ms"] <= r["max_ms"]
        assert not r["plan"]["fcfs_fallback"]
        assert (r["request_bytes"] is None) == (r["path"] == "policy")
    # No case at 1,000 or 10,000 requests: every target says so.
    assert {t["status"] for t in data["targets"]} == {"not measured"}
    assert data["reference"]["paper_scheduling_ms_per_iteration"] == 7.63

    text = md.read_text(encoding="utf-8")
    assert text.startswith("# Benchmarks\n\nIntro.")
    assert other in text
    assert text.count(begin_marker(SECTION)) == text.count(end_marker(SECTION)) == 1
    section = text[text.index(begin_marker(SECTION)) : text.index(end_marker(SECTION))]
    assert f"`{data['command']}`" in section
    assert data["date"] in section
    for heading in ("### Targets", "### Results", "| level | requests | path |"):
        assert heading in section
    assert "NOT MEASURED" in section
    assert "plan_rotation" in capsys.readouterr().out

    # A second run rewrites its own section only.
    rc, _, _ = _run(tmp_path)
    assert rc == 0
    again = md.read_text(encoding="utf-8")
    assert again.count(begin_marker(SECTION)) == 1
    assert other in again


def test_baseline_flags_a_slower_median(tmp_path: Path) -> None:
    rc, out, _ = _run(tmp_path)
    assert rc == 0
    data = json.loads(out.read_text(encoding="utf-8"))
    results = results_from_json(data)

    unchanged = compare(results, data)
    assert unchanged["regressions"] == 0
    assert len(unchanged["cases"]) == len(results)

    faster_before = json.loads(json.dumps(data))
    faster_before["results"][0]["p50_ms"] /= 2
    flagged = compare(results, faster_before)
    assert flagged["regressions"] == 1
    assert [c["regressed"] for c in flagged["cases"]] == [True] + [False] * (len(results) - 1)

    # Through the command: a baseline far faster than anything real fails it.
    for r in faster_before["results"]:
        r["p50_ms"] = 1e-9
    baseline = tmp_path / "old.json"
    baseline.write_text(json.dumps(faster_before), encoding="utf-8")
    rc, out, md = _run(tmp_path, "--baseline", str(baseline))
    assert rc == 1
    assert json.loads(out.read_text(encoding="utf-8"))["baseline"]["regressions"] == len(results)
    assert "REGRESSED" in md.read_text(encoding="utf-8")


def test_markdown_section_is_appended_then_replaced() -> None:
    first = replace_section("", SECTION, "body-1")
    assert first.startswith("# Benchmarks")
    assert f"{begin_marker(SECTION)}\nbody-1\n{end_marker(SECTION)}" in first
    both = replace_section(first, OTHER, "other-body")
    second = replace_section(both, SECTION, "body-2")
    assert "body-1" not in second
    assert f"{begin_marker(SECTION)}\nbody-2\n{end_marker(SECTION)}" in second
    assert f"{begin_marker(OTHER)}\nother-body\n{end_marker(OTHER)}" in second
    assert second.index(SECTION) < second.index(OTHER)
    with pytest.raises(ValueError, match="no closing"):
        replace_section(begin_marker(SECTION), SECTION, "x")


def test_server_address_is_parsed_from_the_serving_line() -> None:
    assert parse_address("planner serving on 127.0.0.1:40123\n") == "127.0.0.1:40123"
    assert parse_address("planner serving on [::1]:50051") == "[::1]:50051"
    assert parse_address("metrics on http://127.0.0.1:9000/metrics") is None


@pytest.mark.slow
def test_grpc_cases_run_against_a_real_server(tmp_path: Path) -> None:
    out = tmp_path / "rotation.json"
    rc = main(
        [
            "bench",
            "policies",
            "--sizes",
            "30",
            "--block-level-sizes",
            "",
            "--calls",
            "3",
            "--warmup",
            "1",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text(encoding="utf-8"))
    grpc = {(r["path"], r["form"]) for r in data["results"] if r["path"] == "grpc"}
    assert grpc == {("grpc", "rows"), ("grpc", "columns")}
    assert data["grpc_floor"]["calls"] > 0


def test_rotation_quality_on_a_measured_machine_refuses_bad_combinations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    machine = Path(__file__).resolve().parents[2] / "fixtures" / "profiles" / "h100-measured.json"
    base = ["bench", "rotation-quality", "--row", "bundled x1"]
    assert main([*base, "--machine", str(tmp_path / "absent.json")]) == 2
    assert "--machine: no file" in capsys.readouterr().err
    md = tmp_path / "b.md"
    assert main([*base, "--machine", str(machine), "--markdown", str(md)]) == 2
    assert "cannot be combined" in capsys.readouterr().err
    assert not md.exists()
