"""`planner replay --topology serverless`: the table and JSON on a tiny
multi-model trace (unsorted: the topology sorts merged per-model traces),
bad input as exit 2 with one line on stderr, and the Alibaba GenTD26 trace
when ../shared/traces is present."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from replay_cli import replay, write_trace

from planner.cli import main
from planner.replay.serverless_engine import SERVERLESS_POLICY_NAMES

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
ALIBABA = TRACES / "alibaba_GenTD26_lora_request_trace.csv"
SHAREGPT = TRACES / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"

ROWS: list[dict[str, Any]] = [
    {
        "arrival_s": 0.2 * (i % 6) + 0.01 * i,
        "prompt_tokens": 150 + 10 * i,
        "output_tokens": 4 + i % 3,
        "id": f"r{i}",
        "model": f"m{i % 4}",
    }
    for i in range(12)
]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path / "s.jsonl", ROWS)


def test_table_and_json(trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json = tmp_path / "o.json"
    code, out, err = replay(
        capsys, str(trace), "--topology", "serverless", "--quiet", "--json-out", str(out_json)
    )
    assert code == 0, err
    for policy in SERVERLESS_POLICY_NAMES:
        assert policy in out
    assert "Switch latency p50" in out
    data = json.loads(out_json.read_text())
    assert data["topology"] == "serverless"
    assert [p["policy"] for p in data["policies"]] == list(SERVERLESS_POLICY_NAMES)
    for p in data["policies"]:
        assert p["metrics"]["finished"] == len(ROWS)
        assert p["serverless"]["models"] == 4
        assert p["config"]["mig"] == ["gh200-3x24gb"] * 3
    dedicated = next(p for p in data["policies"] if p["policy"] == "dedicated")
    # Weights over PCIe at 55 GB/s, shared by the loads of the three slices.
    alone = 16.06e9 / 55e9
    latency = dedicated["serverless"]["switch_latency_s"]
    assert alone * (1 - 1e-3) <= latency["p50"] <= latency["max"] <= 3 * alone * (1 + 1e-3)
    assert dedicated["config"]["load_link"] == "pcie"
    sllm = next(p for p in data["policies"] if p["policy"] == "sllm")
    assert sllm["config"]["load_link"] == "c2c"
    assert sllm["config"]["engine_init_s"] == pytest.approx(1.7 - 16.06e9 / 405e9, 1e-3)
    ours = next(p for p in data["policies"] if p["policy"] == "c2cserve")
    assert ours["serverless"]["cold_start_ratio"] == pytest.approx(1.0)
    # From the 5 s TTFT target: urgent at 2.5 s of slack, hold 2.5 s; no
    # starvation backstop (null), so no slack is enough for a victim.
    assert ours["config"]["preemption"] == {
        "min_hold_s": pytest.approx(2.5),
        "urgent_slack_s": pytest.approx(2.5),
        "victim_slack_s": None,
        "starve_after_s": None,
        "max_drain_s": pytest.approx(10.0),
    }


def test_sweep_json_and_plots(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json = tmp_path / "o.json"
    plots = tmp_path / "plots"
    args = ["--topology", "serverless", "--quiet", "--policy", "c2cserve", "--policy", "sllm"]
    for scale in ("0.5", "1", "2"):
        args += ["--rate-scale", scale]
    code, out, err = replay(
        capsys, str(trace), *args, "--json-out", str(out_json), "--report-dir", str(plots)
    )
    assert code == 0, err
    assert "SLO attainment vs load (TTFT / TPOT / both met" in out
    data = json.loads(out_json.read_text())
    assert [p["rate_scale"] for p in data["sweep"]] == [0.5, 1.0, 2.0]
    for point in data["sweep"]:
        names = [m["policy"] for m in point["metrics"]]
        assert names == ["c2cserve", "sllm"]
        for m in point["metrics"]:
            assert 0.0 <= m["both_attainment"] <= 1.0
            assert "cold_start_ratio" in m["serverless"]
    written = sorted(p.name for p in plots.iterdir())
    assert written == [
        "attainment_vs_load.png",
        "cold_start_vs_load.png",
        "kv_occupancy.png",
        "link_load.png",
        "queue_length.png",
        "slices.png",
        "tbt_cdf.png",
        "ttft_cdf.png",
    ]
    for name in written:
        assert (plots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "fcfs"], "unknown policy 'fcfs' for --topology serverless"),
        (["--mig", "5"], "--mig: "),
        (["--c2c-gbps", "0"], "--c2c-gbps must be a finite number > 0"),
        (["--c2c-gbps", "nan"], "--c2c-gbps must be a finite number > 0"),
        (["--switch-setup", "-1"], "--switch-setup must be a finite number >= 0"),
        (["--urgent-slack", "nan"], "--urgent-slack must be a finite number"),
        (["--victim-slack", "-1"], "--victim-slack must be a number >= 0"),
        (["--starve-after", "nan"], "--starve-after must be a number >= 0 (inf: never)"),
        (["--max-drain", "-1"], "--max-drain must be a finite number >= 0"),
        (["--models-per-slice", "0"], "--models-per-slice must be >= 1"),
        (["--min-hold", "inf"], "--min-hold must be a finite number >= 0"),
        (["--compute-jitter", "-0.1"], "--compute-jitter must be a finite number >= 0"),
    ],
)
def test_bad_input_exits_2(
    trace: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, _, err = replay(capsys, str(trace), "--topology", "serverless", "--quiet", *args)
    assert code == 2
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_jitter_and_seed_reach_the_run(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(name: str, *jitter: str) -> str:
        out_json = tmp_path / f"{name}.json"
        out_csv = tmp_path / f"{name}.csv"
        code, _, err = replay(
            capsys,
            str(trace),
            "--topology",
            "serverless",
            "--policy",
            "c2cserve",
            "--quiet",
            *jitter,
            "--json-out",
            str(out_json),
            "--requests-out",
            str(out_csv),
        )
        assert code == 0, err
        data = json.loads(out_json.read_text())
        (p,) = data["policies"]
        assert p["config"]["compute_jitter_cv"] == (float(jitter[1]) if jitter else 0.0)
        assert p["config"]["seed"] == (int(jitter[3]) if jitter else 0)
        return out_csv.read_text()

    plain = run("plain")
    a = run("a", "--compute-jitter", "0.25", "--seed", "3")
    assert run("b", "--compute-jitter", "0.25", "--seed", "3") == a
    assert a != plain
    assert run("c", "--compute-jitter", "0.25", "--seed", "4") != a


def test_serverless_flags_need_the_topology(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = replay(capsys, str(trace), "--mig", "7", "--quiet")
    assert code == 2
    assert "--mig applies to --topology serverless only" in err
    code, _, err = replay(capsys, str(trace), "--min-hold", "1", "--quiet")
    assert code == 2
    assert "--min-hold applies to --topology serverless only" in err


def test_bad_load_link_is_an_argparse_error(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["replay", str(trace), "--topology", "serverless", "--load-link", "nvme"])
    assert exc.value.code == 2
    assert "--load-link" in capsys.readouterr().err


@pytest.mark.skipif(
    not (ALIBABA.is_file() and SHAREGPT.is_file()), reason="../shared/traces absent"
)
def test_alibaba_window(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ali.jsonl"
    code = main(
        [
            "trace",
            "import",
            "--format",
            "alibaba",
            str(ALIBABA),
            "--lengths-file",
            str(SHAREGPT),
            "--max-output-tokens",
            "16",
            "--limit",
            "60",
            "-o",
            str(out),
        ]
    )
    assert code == 0
    capsys.readouterr()
    out_json = tmp_path / "o.json"
    code, _, err = replay(
        capsys,
        str(out),
        "--topology",
        "serverless",
        "--rate-scale",
        "1000",
        "--policy",
        "c2cserve",
        "--policy",
        "dedicated",
        "--quiet",
        "--json-out",
        str(out_json),
    )
    assert code == 0, err
    data = json.loads(out_json.read_text())
    for p in data["policies"]:
        assert p["metrics"]["finished"] == 60
        assert p["serverless"]["models"] > 1


def test_starvation_backstop_reports_its_bound(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json = tmp_path / "o.json"
    base = [str(trace), "--topology", "serverless", "--quiet", "--policy", "c2cserve"]
    code, _, err = replay(capsys, *base, "--json-out", str(out_json))
    assert code == 0, err
    off = json.loads(out_json.read_text())["policies"][0]["serverless"]
    assert off["starvation_bound_s"] is None
    code, out, err = replay(
        capsys, *base, "--starve-after", "2", "--max-drain", "1", "--json-out", str(out_json)
    )
    assert code == 0, err
    on = json.loads(out_json.read_text())["policies"][0]
    assert on["config"]["preemption"]["starve_after_s"] == 2.0
    bound = on["serverless"]["starvation_bound_s"]
    assert bound is not None and bound >= 2.0
    assert on["serverless"]["placement_wait_s"]["max"] <= bound
    assert "Starvation bound" in out
