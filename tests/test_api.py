"""planner.api.replay: the command's runs as pandas tables."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

import pandas as pd
import pytest

from planner.api import RotationSettings, SharedSettings, replay, sweep
from planner.replay.request_table import COLUMNS
from planner.trace.io import write_trace
from planner.trace.records import TraceRequest

ROOT = Path(__file__).resolve().parents[1]


def small_trace(n: int = 12) -> list[TraceRequest]:
    return [TraceRequest(0.05 * i, 200 + 10 * i, 6 + i % 4, id=f"r{i}") for i in range(n)]


def test_summary_and_requests_cover_every_policy_and_rate_scale() -> None:
    runs = replay(small_trace(), policies=["fcfs", "lvf"], rate_scales=[1, 2])
    assert list(zip(runs.summary.policy, runs.summary.rate_scale, strict=True)) == [
        ("fcfs", 1.0),
        ("lvf", 1.0),
        ("fcfs", 2.0),
        ("lvf", 2.0),
    ]
    assert {"both_attainment", "throughput_tok_s", "ttft_s.p99", "tpot_s.p50"} <= set(
        runs.summary.columns
    )
    assert list(runs.requests.columns) == list(COLUMNS)
    assert len(runs.requests) == 4 * 12
    assert len(runs.results) == 4
    # The summary and the per-request rows tell the same story.
    per_run = runs.requests.groupby(["policy", "rate_scale"]).both_met.mean()
    for row in runs.summary.itertuples():
        assert per_run[(row.policy, row.rate_scale)] == pytest.approx(row.both_attainment)


def test_knobs_reach_the_run() -> None:
    loose = replay(small_trace(), policies=["fcfs"], slo_ttft=10.0)
    tight = replay(small_trace(), policies=["fcfs"], slo_ttft=1e-4)
    assert set(loose.requests.slo_ttft_s) == {10.0}
    assert set(tight.requests.slo_ttft_s) == {1e-4}
    assert tight.summary.ttft_attainment[0] == 0.0


def test_a_dataframe_trace_and_the_other_topologies() -> None:
    frame = pd.DataFrame(
        {"arrival_s": [0.0, 0.1, 0.2], "prompt_tokens": [100, 200, 300], "output_tokens": [5, 6, 7]}
    )
    runs = replay(frame, topology="cluster", policies=["kunserve", "replication"])
    assert list(runs.summary.policy) == ["kunserve", "replication"]
    assert any(c.startswith("cluster.") for c in runs.summary.columns)
    assert runs.requests.groupby("policy").size().to_dict() == {"kunserve": 3, "replication": 3}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"slo_ttft": -1.0}, "--slo-ttft must be a finite number > 0, got -1.0"),
        ({"nope": 1}, "unknown knob 'nope'"),
        ({"policies": ["lvf"], "topology": "cluster"}, "unknown policy 'lvf' for --topology"),
        ({"topology": "moon"}, "argument --topology: invalid choice: 'moon'"),
    ],
)
def test_bad_knobs_are_named(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        replay(small_trace(), **kwargs)  # type: ignore[arg-type]


def test_bad_dataframe_columns_are_named() -> None:
    with pytest.raises(ValueError, match="unknown columns \\['prompt'\\]"):
        replay(pd.DataFrame({"arrival_s": [0.0], "prompt": [1], "output_tokens": [1]}))


def test_the_docs_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    text = (ROOT / "docs" / "python-api.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks
    monkeypatch.chdir(ROOT)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for block in blocks:
            exec(compile(block, "docs/python-api.md", "exec"), {"__name__": "docs"})
    assert "--slo-ttft must be a finite number > 0" in out.getvalue()
    assert os.getcwd() == str(ROOT)


def test_settings_objects_a_config_file_and_keywords_in_that_order(tmp_path: Path) -> None:
    config = tmp_path / "knobs.yaml"
    config.write_text("slo_ttft: 0.5\nslo_tbt: 0.2\nalpha: 1.5\n", encoding="utf-8")
    runs = replay(
        small_trace(),
        policies=["lvf"],
        config=config,
        settings=[SharedSettings(slo_ttft=2.0), RotationSettings(alpha=2.5)],
        slo_ttft=4.0,
    )
    assert set(runs.requests.slo_ttft_s) == {4.0}  # the keyword
    assert set(runs.requests.slo_tbt_s) == {0.1}  # the settings object's default
    assert runs.results[0].config["alpha"] == 2.5  # the settings object over the file
    bad = tmp_path / "bad.yaml"
    bad.write_text("slo_ttft: 1\n\nalpah: 2\n", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"{bad}:3: alpah: unknown key")):
        replay(small_trace(), config=bad)


def test_sweep_returns_the_grid_as_a_table(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    write_trace(trace, small_trace())
    table = sweep({"trace": str(trace), "grid": {"policy": ["fcfs", "lvf"], "alpha": [1, 3]}})
    assert list(zip(table.policy, table.alpha, strict=True)) == [
        ("fcfs", 1.0),
        ("fcfs", 3.0),
        ("lvf", 1.0),
        ("lvf", 3.0),
    ]
    # alpha is LVF's: FCFS's rows do not change with it.
    fcfs = table[table.policy == "fcfs"].drop(columns=["config_id", "alpha", "wall_s"])
    assert fcfs.iloc[0].equals(fcfs.iloc[1])
    with pytest.raises(ValueError, match="grid: alpha: a grid key takes a non-empty list"):
        sweep({"trace": str(trace), "grid": {"alpha": 3}})
