"""The per-request table and --requests-out on every topology."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from planner.cli import main
from planner.commands.replay import DEFAULT_POLICIES
from planner.replay.records import ReplayResult, ReplayTotals, RequestOutcome
from planner.replay.request_table import COLUMNS, request_table

TOTALS = ReplayTotals(0, 0.0, 0.0, 0, 0, 0.0, 0, 0, 0, 0, 0)


def outcome(rid: str, times: list[float], finish: float | None, **kw: int) -> RequestOutcome:
    return RequestOutcome(
        id=rid,
        arrival_s=1.0,
        prompt_tokens=10,
        output_tokens=4,
        slo_ttft_s=0.5,
        slo_tbt_s=0.1,
        token_times_s=times,
        finish_s=finish,
        **kw,
    )


def test_rows_hold_each_requests_latencies_and_slos() -> None:
    result = ReplayResult(
        policy="lvf",
        requests=[
            # TTFT 0.25, gaps 0.05 / 0.15 / 0.1: TPOT 0.1 meets 0.1, max TBT 0.15.
            outcome("a", [1.25, 1.30, 1.45, 1.55], 1.55, preemptions=1, swap_outs=1, swap_ins=1),
            # TTFT 0.75 misses; one token, finished: TPOT met by definition.
            outcome("b", [1.75], 1.75),
            # Never started: nothing met, no latencies.
            outcome("c", [], None),
        ],
        timeline=[],
        totals=TOTALS,
        config={"rate_scale": 2.0},
    )
    table = request_table([result])
    assert list(table.columns) == list(COLUMNS)
    a, b, c = (table.iloc[i] for i in range(3))
    assert (a.policy, a.rate_scale, a.id, a.tokens) == ("lvf", 2.0, "a", 4)
    assert a.ttft_s == pytest.approx(0.25)
    assert a.tpot_s == pytest.approx(0.1)
    assert a.max_tbt_s == pytest.approx(0.15)
    assert (a.ttft_met, a.tpot_met, a.both_met) == (True, True, True)
    assert (a.preemptions, a.swap_outs, a.swap_ins) == (1, 1, 1)
    assert b.ttft_s == pytest.approx(0.75)
    assert math.isnan(b.tpot_s) and math.isnan(b.max_tbt_s)
    assert (b.ttft_met, b.tpot_met, b.both_met) == (False, True, False)
    assert c.tokens == 0 and math.isnan(c.ttft_s) and math.isnan(c.finish_s)
    assert (c.ttft_met, c.tpot_met, c.both_met) == (False, False, False)


def write_trace(path: Path, models: bool = False) -> Path:
    rows = [
        {
            "arrival_s": 0.05 * i,
            "prompt_tokens": 200 + 10 * i,
            "output_tokens": 6 + i % 4,
            "id": f"r{i}",
            **({"model": f"m{i % 3}"} if models else {}),
        }
        for i in range(9)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("topology", sorted(DEFAULT_POLICIES))
def test_requests_out_writes_every_policy_and_rate_scale(
    topology: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policies = len(DEFAULT_POLICIES[topology])
    trace = write_trace(tmp_path / "t.jsonl", models=topology == "serverless")
    out = tmp_path / "deep" / "r.parquet"
    code = main(
        [
            "replay",
            str(trace),
            "--topology",
            topology,
            "--quiet",
            "--rate-scale",
            "1",
            "--rate-scale",
            "2",
            "--requests-out",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    table = pd.read_parquet(out)
    assert len(table) == 9 * policies * 2
    assert table.groupby(["policy", "rate_scale"]).size().eq(9).all()
    assert set(table.policy) == set(DEFAULT_POLICIES[topology])
    assert f"wrote {out}" in capsys.readouterr().out


def test_requests_on_standard_output_and_the_report_on_standard_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_trace(tmp_path / "t.jsonl")
    code = main(["replay", str(trace), "--quiet", "--requests-out", "-"])
    out, err = capsys.readouterr()
    assert code == 0, err
    table = pd.read_csv(io.StringIO(out))
    assert list(table.columns) == list(COLUMNS)
    assert set(table.policy) == {"fcfs", "lvf"}
    assert "Goodput" in err
    assert not list(tmp_path.glob("-*"))


def test_json_on_standard_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "t.jsonl")
    code = main(["replay", str(trace), "--quiet", "--json-out", "-", "--policy", "fcfs"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert [p["policy"] for p in json.loads(out)["policies"]] == ["fcfs"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--requests-out", "r.txt"], "--requests-out r.txt: must end in .csv or .parquet"),
        (
            ["--requests-out", "-", "--json-out", "-"],
            "only one of --json-out and --requests-out can be -",
        ),
    ],
)
def test_bad_requests_out_is_refused_before_the_run(
    args: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    trace = write_trace(tmp_path / "t.jsonl")
    code = main(["replay", str(trace), "--quiet", *args])
    _out, err = capsys.readouterr()
    assert code == 2
    assert err.startswith("planner replay: ") and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]
