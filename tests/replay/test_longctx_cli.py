"""`planner replay --topology long-context`: the comparison table and JSON on
a tiny generated trace, a Mooncake slice when ../shared/traces is there, and
bad input as exit 2 with one line on stderr (never a traceback)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from replay_cli import one_line, replay, write_trace

from planner.cli import main

ROWS: list[dict[str, Any]] = [
    {"arrival_s": 0.0, "prompt_tokens": 9000, "output_tokens": 12, "id": "a"},
    {"arrival_s": 0.1, "prompt_tokens": 16000, "output_tokens": 8, "id": "b"},
    {"arrival_s": 0.2, "prompt_tokens": 12000, "output_tokens": 20, "id": "c"},
    {"arrival_s": 0.3, "prompt_tokens": 30000, "output_tokens": 6, "id": "d"},
]
MOONCAKE = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
MOONCAKE_FILE = MOONCAKE / "mooncake_conversation_trace.jsonl"


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path / "lc.jsonl", ROWS)


# 3 GB of KV for Llama-3-8B: 45,776 layer blocks of 64 KiB; the four requests
# need 4,191 blocks a layer, so they do not fit with every layer on the GPU.
TIGHT = ("--topology", "long-context", "--gpu-kv-gb", "3", "--quiet")


def test_all_five_policies_table_and_json(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "160")  # the table's five columns unclipped
    out_json = tmp_path / "out.json"
    code, out, err = replay(
        capsys, str(trace), *TIGHT, "--slo-scale", "1.5", "--json-out", str(out_json)
    )
    assert code == 0, err
    for name in ("orbitflow", "deepspeed", "flexgen", "flexgen+", "greedy"):
        assert name in out
    assert "Solver time share" in out and "TBT p95" in out
    data = json.loads(out_json.read_text())
    assert data["topology"] == "long-context"
    by_name = {p["policy"]: p for p in data["policies"]}
    assert list(by_name) == ["orbitflow", "deepspeed", "flexgen", "flexgen+", "greedy"]
    for entry in by_name.values():
        assert entry["metrics"]["finished"] == 4 and entry["offload"]["rejected"] == 0
        assert entry["offload"]["over_budget_steps"] == 0
        assert 0 <= entry["offload"]["solver_time_share"] <= 1
        assert entry["config"]["gpu_layer_blocks"] == 45776
    assert by_name["greedy"]["offload"]["replans"] == by_name["greedy"]["offload"]["decode_steps"]
    assert by_name["deepspeed"]["offload"]["replans"] == 0
    assert by_name["flexgen"]["offload"]["replans"] == 1
    assert by_name["orbitflow"]["offload"]["replan_reasons"]["no_plan"] == 1
    # Each orbitflow plan's solve reports its status, gap, work and time; the
    # baselines solve nothing.
    solves = by_name["orbitflow"]["offload"]["solves"]
    assert solves["solves"] == by_name["orbitflow"]["offload"]["replans"]
    assert sum(solves["statuses"].values()) == solves["solves"]
    assert set(solves["statuses"]) <= {"OPTIMAL", "FEASIBLE", "INFEASIBLE"}
    assert 0 <= solves["gap_mean"] <= solves["gap_max"] < 1
    assert solves["nodes"] > 0 and solves["wall_s"] > 0
    assert solves["over_time_limit"] == 0
    assert "Solver gap max" in out and "Solves proved optimal" in out
    for name in ("deepspeed", "flexgen", "flexgen+", "greedy"):
        assert by_name[name]["offload"]["solves"]["solves"] == 0
    # Every policy decodes the same tokens; deepspeed moves every layer.
    fetched = {n: e["offload"]["fetched_blocks"] for n, e in by_name.items()}
    assert fetched["deepspeed"] == max(fetched.values())


def test_default_topology_is_still_rotation(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = replay(capsys, str(trace), "--quiet", "--policy", "fcfs")
    assert code == 0, err
    assert "Replay of" in out and "Long-context" not in out


def test_orbitflow_solves_stop_on_work_so_a_run_repeats_exactly(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A node limit small enough to bind: the plans, and so every simulated
    # number, depend on it and not on how fast this machine is.
    runs = []
    for name in ("first.json", "again.json"):
        out_json = tmp_path / name
        code, _, err = replay(
            capsys, str(trace), *TIGHT, "--policy", "orbitflow", "--slo-scale", "1.5",
            "--offload-node-limit", "40", "--json-out", str(out_json),
        )  # fmt: skip
        assert code == 0, err
        doc = json.loads(out_json.read_text(encoding="utf-8"))
        run = doc["policies"][0]
        assert run["config"]["offload_node_limit"] == 40
        assert run["config"]["offload_ilp_work_limit"] == 0.05
        assert run["config"]["offload_spread_moves"] is True
        solves = run["offload"]["solves"]
        # Every solve stopped on its work limit or a proof, none on the clock.
        assert solves["solves"] > 0 and solves["over_time_limit"] == 0
        assert solves["nodes"] <= 40 * solves["solves"]

        def simulated(d: dict[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in d.items() if "wall" not in k and "speed" not in k}

        metrics = {k: v for k, v in run["metrics"].items() if not isinstance(v, dict | list)}
        runs.append(
            json.dumps([simulated(metrics), simulated(run["totals"]), run["offload"]["replans"]])
        )
    assert runs[0] == runs[1]


def test_offload_spread_off_reaches_the_planner(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json = tmp_path / "nospread.json"
    code, _, err = replay(
        capsys, str(trace), *TIGHT, "--policy", "orbitflow", "--offload-spread", "off",
        "--offload-node-limit", "40", "--json-out", str(out_json),
    )  # fmt: skip
    assert code == 0, err
    run = json.loads(out_json.read_text(encoding="utf-8"))["policies"][0]
    assert run["config"]["offload_spread_moves"] is False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--topology", "long-context", "--policy", "lvf"),
            "unknown policy 'lvf' for --topology long-context",
        ),
        (("--policy", "orbitflow"), "unknown policy 'orbitflow' for --topology rotation"),
        (("--gpu-kv-gb", "4"), "--gpu-kv-gb applies to --topology long-context only"),
        (("--slo-scale", "1.5"), "--slo-scale applies to --topology long-context only"),
        (("--offload-backend", "bnb"), "--offload-backend applies to --topology long-context only"),
        (
            ("--offload-node-limit", "100"),
            "--offload-node-limit applies to --topology long-context only",
        ),
        (
            ("--topology", "long-context", "--offload-node-limit", "0"),
            "--offload-node-limit must be >= 1",
        ),
        (
            ("--offload-spread", "off"),
            "--offload-spread applies to --topology long-context only",
        ),
        (
            ("--topology", "long-context", "--slo-scale", "0"),
            "--slo-scale must be a finite number > 0",
        ),
        (
            ("--topology", "long-context", "--gpu-kv-gb", "nan"),
            "--gpu-kv-gb must be a finite number > 0",
        ),
        (
            ("--topology", "long-context", "--gpu-kv-gb", "1e-9"),
            "--gpu-kv-gb: the GPU KV memory holds no block",
        ),
        (
            ("--topology", "long-context", "--offload-time-limit", "-1"),
            "--offload-time-limit must be",
        ),
        (("--topology", "long-context", "--max-running", "0"), "--max-running must be"),
        (("--topology", "long-context", "--profile", "nope@h100"), "unknown model 'nope'"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    trace: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    code, out, err = replay(capsys, str(trace), "--quiet", *args)
    assert code == 2 and out == ""
    assert message in one_line(err)


def test_unknown_topology_is_an_argparse_error(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["replay", str(trace), "--topology", "ring"])
    assert exc.value.code == 2
    assert "invalid choice: 'ring'" in capsys.readouterr().err


@pytest.mark.skipif(not MOONCAKE_FILE.is_file(), reason="../shared/traces is absent")
def test_mooncake_slice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sliced = tmp_path / "mooncake.jsonl"
    code = main(
        [
            "trace", "import", str(MOONCAKE_FILE), "--format", "mooncake",
            "--limit", "12", "-o", str(sliced),
        ]
    )  # fmt: skip
    assert code == 0
    capsys.readouterr()
    out_json = tmp_path / "out.json"
    code, _, err = replay(
        capsys, str(sliced), "--topology", "long-context", "--gpu-kv-gb", "4", "--quiet",
        "--policy", "deepspeed", "--policy", "greedy", "--policy", "flexgen+",
        "--json-out", str(out_json),
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out_json.read_text())
    for entry in data["policies"]:
        m = entry["metrics"]
        assert m["finished"] + entry["offload"]["rejected"] == 12
        assert entry["offload"]["over_budget_steps"] == 0
