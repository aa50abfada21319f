"""`planner replay` as a user runs it (in process, on tiny traces): the
comparison table, the load sweep, JSON and plots; bad input is exit 2 with
one line on stderr."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from replay_cli import one_line, replay, write_trace

TRACE: list[dict[str, Any]] = [
    {"arrival_s": 0.0, "prompt_tokens": 512, "output_tokens": 20, "id": "a"},
    {"arrival_s": 0.05, "prompt_tokens": 1500, "output_tokens": 8, "id": "b"},
    {"arrival_s": 0.1, "prompt_tokens": 64, "output_tokens": 30, "id": "c"},
    {"arrival_s": 0.2, "prompt_tokens": 3000, "output_tokens": 5, "id": "d"},
    {"arrival_s": 0.35, "prompt_tokens": 200, "output_tokens": 12, "id": "e"},
    {"arrival_s": 0.5, "prompt_tokens": 800, "output_tokens": 16, "id": "f"},
]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path / "tiny.jsonl", TRACE)


def test_default_policies_print_the_comparison(
    trace: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(trace.parent)  # a short path: the title does not wrap
    code, out, err = replay(capsys, trace.name, "--quiet")
    assert code == 0, err
    assert err == ""
    assert "Replay of tiny.jsonl (6 requests, rate x1" in out
    assert "fcfs" in out and "lvf" in out
    assert "SLO attainment vs load" not in out  # one rate: no sweep table


def test_policies_sweep_json_and_plots(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    json_out = tmp_path / "out" / "replay.json"
    plots = tmp_path / "plots"
    code, out, err = replay(
        capsys,
        str(trace),
        "--quiet",
        "--policy",
        "waiting-first",
        "--policy",
        "swapped-first",
        "--rate-scale",
        "1",
        "--rate-scale",
        "4",
        "--json-out",
        str(json_out),
        "--report-dir",
        str(plots),
    )
    assert code == 0, err
    assert "waiting-first" in out and "swapped-first" in out and "fcfs" not in out
    assert "SLO attainment vs load" in out
    assert f"wrote {json_out}" in out
    data = json.loads(json_out.read_text(encoding="utf-8"))
    policies = data["policies"]
    assert [p["policy"] for p in policies] == ["waiting-first", "swapped-first"]
    for p in policies:
        assert p["metrics"]["requests"] == 6 and p["metrics"]["finished"] == 6
        assert p["config"]["rate_scale"] == 1.0 and p["config"]["policy"] == p["policy"]
        assert p["totals"]["iterations"] > 0
    assert [point["rate_scale"] for point in data["sweep"]] == [1.0, 4.0]
    for point in data["sweep"]:
        assert [m["policy"] for m in point["metrics"]] == ["waiting-first", "swapped-first"]
    names = sorted(p.name for p in plots.iterdir())
    assert names == [
        "attainment_vs_load.png",
        "kv_occupancy.png",
        "queue_length.png",
        "tbt_cdf.png",
        "ttft_cdf.png",
    ]
    assert all((plots / n).stat().st_size > 0 for n in names)
    assert f"wrote 5 plots to {plots}" in out


def test_a_faster_rate_compresses_the_arrivals(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Every request finishes by itself in well under a second; replayed 10x
    # faster the run is shorter but serves the same tokens.
    spans = []
    for scale in ("1", "10"):
        out_json = tmp_path / f"x{scale}.json"
        code, _, err = replay(
            capsys, str(trace), "--quiet", "--policy", "fcfs", "--rate-scale", scale,
            "--json-out", str(out_json),
        )  # fmt: skip
        assert code == 0, err
        (p,) = json.loads(out_json.read_text(encoding="utf-8"))["policies"]
        assert p["metrics"]["output_tokens"] == sum(r["output_tokens"] for r in TRACE)
        spans.append(p["totals"]["simulated_s"])
    assert spans[1] < spans[0]


def test_replay_is_deterministic(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = []
    for name in ("one.json", "two.json"):
        code, _, err = replay(
            capsys, str(trace), "--quiet", "--policy", "lvf", "--policy", "fcfs",
            "--max-batched-tokens", "256", "--json-out", str(tmp_path / name),
        )  # fmt: skip
        assert code == 0, err
        data = json.loads((tmp_path / name).read_text(encoding="utf-8"))
        for p in data["policies"]:
            del p["totals"]["wall_s"]
            for key in ("wall_s", "sim_speed"):
                del p["metrics"][key]
        runs.append(data)
    assert runs[0] == runs[1]


def test_request_too_large_for_the_gpu_finishes_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Half a million prompt tokens do not fit in an 80 GB GPU's KV pool: the
    # request is reported unfinished and the run ends (the built-in cost model
    # makes empty iterations free, so a stuck engine would spin forever).
    rows = [
        {"arrival_s": 0.0, "prompt_tokens": 100, "output_tokens": 4},
        {"arrival_s": 0.1, "prompt_tokens": 500_000, "output_tokens": 4},
        {"arrival_s": 0.2, "prompt_tokens": 100, "output_tokens": 4},
    ]
    path = write_trace(tmp_path / "huge.jsonl", rows)
    out_json = tmp_path / "huge.json"
    code, _, err = replay(
        capsys, str(path), "--quiet", "--policy", "fcfs", "--policy", "lvf",
        "--policy", "waiting-first", "--policy", "swapped-first", "--json-out", str(out_json),
    )  # fmt: skip
    assert code == 0, err
    for p in json.loads(out_json.read_text(encoding="utf-8"))["policies"]:
        assert (p["metrics"]["finished"], p["metrics"]["unfinished"]) == (2, 1), p["policy"]


def test_tight_cpu_and_token_budget_still_serve_everyone(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json = tmp_path / "tight.json"
    code, _, err = replay(
        capsys, str(trace), "--quiet", "--policy", "lvf", "--cpu-kv-gb", "0",
        "--max-batched-tokens", "64", "--max-running", "2", "--json-out", str(out_json),
    )  # fmt: skip
    assert code == 0, err
    (p,) = json.loads(out_json.read_text(encoding="utf-8"))["policies"]
    assert p["config"]["cpu_kv_blocks"] == 0 and p["config"]["max_batched_tokens"] == 64
    assert p["metrics"]["finished"] == 6


# -- bad input --------------------------------------------------------------------


def test_bad_trace_line_names_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"arrival_s": 0.0, "prompt_tokens": 10, "output_tokens": 2}\n'
        '{"arrival_s": 0.1, "prompt_tokens": -3, "output_tokens": 2}\n',
        encoding="utf-8",
    )
    code, out, err = replay(capsys, str(path), "--quiet")
    assert code == 2 and out == ""
    line = one_line(err)
    assert f"{path}:2: prompt_tokens:" in line


def test_missing_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = replay(capsys, str(tmp_path / "nope.jsonl"), "--quiet")
    assert code == 2
    assert "nope.jsonl" in one_line(err)


@pytest.mark.parametrize(
    ("profile", "words"),
    [
        ("no-such-model@h100-sxm-80gb", "unknown model 'no-such-model'"),
        ("llama-3-8b@no-such-gpu", "unknown hardware 'no-such-gpu'"),
        ("llama-3-8b", "expected MODEL@HARDWARE"),
    ],
)
def test_unknown_profile(
    trace: Path, capsys: pytest.CaptureFixture[str], profile: str, words: str
) -> None:
    code, out, err = replay(capsys, str(trace), "--quiet", "--profile", profile)
    assert code == 2 and out == ""
    assert words in one_line(err)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--slo-ttft", "0"),
        ("--slo-ttft", "-1"),
        ("--slo-ttft", "nan"),
        ("--slo-tbt", "0"),
        ("--rate-scale", "0"),
        ("--rate-scale", "-2"),
        ("--rate-scale", "nan"),
        ("--rate-scale", "inf"),
        ("--max-batched-tokens", "0"),
        ("--max-running", "0"),
        ("--cpu-kv-gb", "-1"),
        ("--transfer-budget-blocks", "-1"),
        ("--block-size", "0"),
        ("--gpu-kv-blocks", "0"),
        ("--cpu-kv-blocks", "-1"),
    ],
)
def test_bad_option_values(
    trace: Path, capsys: pytest.CaptureFixture[str], option: str, value: str
) -> None:
    code, out, err = replay(capsys, str(trace), "--quiet", option, value)
    assert code == 2 and out == ""
    assert option in one_line(err)


def test_a_bad_rate_scale_among_good_ones(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = replay(capsys, str(trace), "--quiet", "--rate-scale", "2", "--rate-scale", "0")
    assert code == 2 and out == ""
    assert "--rate-scale must be a finite number > 0, got 0.0" in one_line(err)


def test_the_engine_s_own_pools_and_block_size(
    trace: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out_json = tmp_path / "run.json"
    code, out, err = replay(
        capsys,
        str(trace),
        "--quiet",
        "--policy",
        "lvf",
        "--block-size",
        "32",
        "--gpu-kv-blocks",
        "150",
        "--cpu-kv-blocks",
        "40",
        "--json-out",
        str(out_json),
    )
    assert code == 0, err
    assert "GPU KV 150 blocks, CPU KV 40 blocks" in out
    config = json.loads(out_json.read_text())["policies"][0]["config"]
    assert config["gpu_kv_blocks"] == 150 and config["cpu_kv_blocks"] == 40
    assert config["block_size_tokens"] == 32
    # A block of llama-3-8b (the default profile) holds 32 tokens' KV.
    assert config["block_bytes"] == 32 * 128 * 1024


def test_the_engine_s_pools_apply_to_one_engine_only(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = replay(
        capsys, str(trace), "--quiet", "--topology", "cluster", "--gpu-kv-blocks", "100"
    )
    assert code == 2 and out == ""
    assert "--gpu-kv-blocks applies to --topology rotation only" in one_line(err)
