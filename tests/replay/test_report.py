"""The replay report: terminal table, JSON, PNG plots, progress bar."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from rich.text import Text

from planner.replay import plots
from planner.replay.metrics import PolicyMetrics, compare
from planner.replay.progress import replay_progress
from planner.replay.records import ReplayResult, ReplayTotals, RequestOutcome, TimelineSample
from planner.replay.report import (
    comparison_table,
    fmt_bytes,
    fmt_seconds,
    metrics_from_json,
    print_report,
    sweep_from_json,
    to_json,
    write_json,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run(policy: str, ttft: float, gap: float, *, n: int = 20, seed: int = 0) -> ReplayResult:
    """n requests one second apart, 4 tokens each (the last unfinished)."""
    rng = np.random.default_rng(seed)
    requests = []
    for i in range(n):
        first = i + ttft * (1 + 0.5 * rng.random())
        tokens = [first + k * gap * (1 + rng.random()) for k in range(4)]
        done = i < n - 1
        requests.append(
            RequestOutcome(
                id=f"r{i}",
                arrival_s=float(i),
                prompt_tokens=64,
                output_tokens=4,
                slo_ttft_s=1.0,
                slo_tbt_s=0.1,
                token_times_s=tokens if done else tokens[:2],
                finish_s=tokens[-1] if done else None,
                preemptions=i % 3 == 0,
            )
        )
    timeline = [
        TimelineSample(
            time_s=0.05 * k,
            iteration_s=0.05,
            stall_s=0.0,
            gpu_kv_blocks_used=int(50 + 40 * np.sin(k / 20)),
            cpu_kv_blocks_used=k % 7 if policy == "lvf" else 0,
            running=4,
            waiting=k % 5,
            rotary=k % 3 if policy == "lvf" else 0,
            prefill_tokens=64,
            decode_tokens=4,
        )
        for k in range(400)
    ]
    totals = ReplayTotals(
        iterations=len(timeline),
        simulated_s=20.0,
        wall_s=0.25,
        bytes_d2h=3 * 2**30,
        bytes_h2d=2**20,
        stall_s=0.125,
        preemptions=7,
        swap_outs=5 if policy == "lvf" else 0,
        swap_ins=5 if policy == "lvf" else 0,
        peak_gpu_kv_blocks=90,
        gpu_kv_blocks_total=100,
    )
    config = {"trace": Path("fixtures/x.jsonl"), "slo": (1.0, 0.1), "nan": float("nan")}
    return ReplayResult(policy, requests, timeline, totals, config)


@pytest.fixture(scope="module")
def results() -> list[ReplayResult]:
    return [run("fcfs", ttft=0.9, gap=0.08), run("lvf", ttft=0.3, gap=0.04, seed=1)]


@pytest.fixture(scope="module")
def metrics(results: list[ReplayResult]) -> list[PolicyMetrics]:
    return compare(results)


@pytest.fixture(scope="module")
def sweep() -> dict[float, list[PolicyMetrics]]:
    return {
        scale: compare(
            [run("fcfs", 0.6 * scale, 0.05 * scale, n=8), run("lvf", 0.3 * scale, 0.04, n=8)]
        )
        for scale in (0.5, 1.0, 2.0)
    }


def test_formatting() -> None:
    assert fmt_seconds(None) == "—"
    assert fmt_seconds(0.0421) == "42.1 ms"
    assert fmt_seconds(0.5) == "500 ms"
    assert fmt_seconds(1.5) == "1.50 s"
    assert fmt_seconds(123.4) == "123 s"
    assert fmt_bytes(512) == "512 B"
    assert fmt_bytes(3 * 2**30) == "3.0 GiB"


def test_table_has_policies_and_numbers(
    metrics: list[PolicyMetrics], sweep: dict[float, list[PolicyMetrics]]
) -> None:
    console = Console(record=True, width=100, file=io.StringIO())
    print_report(metrics, console=console, title="FCFS vs LVF", sweep=sweep)
    text = console.export_text()
    for m in metrics:
        assert m.policy in text
        assert m.ttft_attainment is not None
        assert m.tbt_attainment is not None
        assert f"{100 * m.ttft_attainment:.1f}%" in text
        assert f"{100 * m.tbt_attainment:.1f}%" in text
    for label in ("TTFT p99", "TBT p50", "TPOT p90", "Output tokens/s", "Preemptions"):
        assert label in text
    assert "3.0 GiB" in text
    assert "Rate scale" in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_table_marks_the_best_value(metrics: list[PolicyMetrics]) -> None:
    table = comparison_table(metrics)
    # Row 1 is TTFT attainment; lvf's shorter TTFT wins it.
    fcfs, lvf = (list(table.columns[i].cells)[1] for i in (1, 2))
    assert isinstance(fcfs, Text)
    assert isinstance(lvf, Text)
    assert "bold" in str(lvf.style)
    assert "bold" not in str(fcfs.style)


def test_json_round_trip(
    tmp_path: Path,
    results: list[ReplayResult],
    metrics: list[PolicyMetrics],
    sweep: dict[float, list[PolicyMetrics]],
) -> None:
    path = write_json(tmp_path / "out" / "replay.json", results, metrics, sweep=sweep)
    assert [p.name for p in path.parent.iterdir()] == ["replay.json"]  # no temp left
    data = json.loads(path.read_text())
    assert metrics_from_json(data) == metrics
    assert sweep_from_json(data) == sweep
    first = data["policies"][0]
    assert first["config"] == {"trace": "fixtures/x.jsonl", "slo": [1.0, 0.1], "nan": None}
    assert first["totals"]["bytes_d2h"] == 3 * 2**30
    assert "requests" not in first
    full = to_json(results, metrics, include_requests=True)
    assert len(full["policies"][1]["requests"]) == 20
    assert len(full["policies"][1]["timeline"]) == 400
    assert "sweep" not in full
    json.dumps(full, allow_nan=False)


def test_json_rejects_mismatched_pairs(
    results: list[ReplayResult], metrics: list[PolicyMetrics]
) -> None:
    with pytest.raises(ValueError, match="paired"):
        to_json(results, metrics[::-1])
    with pytest.raises(ValueError, match="schema"):
        metrics_from_json({"schema": 0, "policies": []})


def test_plots_are_pngs(
    tmp_path: Path,
    results: list[ReplayResult],
    metrics: list[PolicyMetrics],
    sweep: dict[float, list[PolicyMetrics]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(plots, "MAX_POINTS", 100)  # exercise binning, CDF thinning
    monkeypatch.setattr(plots, "DPI", 40)
    paths = plots.write_report(tmp_path / "report", results, metrics, sweep=sweep)
    assert [p.name for p in paths] == [
        "ttft_cdf.png",
        "tbt_cdf.png",
        "kv_occupancy.png",
        "queue_length.png",
        "attainment_vs_load.png",
    ]
    for p in paths:
        data = p.read_bytes()
        assert data.startswith(PNG_SIGNATURE)
        assert len(data) > 1000


def test_plots_without_sweep_or_timeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plots, "DPI", 40)
    bare = run("fcfs", 0.5, 0.05, n=3)
    empty = ReplayResult(bare.policy, bare.requests, [], bare.totals)
    for i, r in enumerate(empty.requests):
        r.slo_ttft_s = 0.5 + i  # per-request SLOs: no single line
    paths = plots.write_report(tmp_path, [empty], compare([empty]))
    assert len(paths) == 4
    assert all(p.read_bytes().startswith(PNG_SIGNATURE) for p in paths)


def test_envelope_keeps_peaks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plots, "MAX_POINTS", 10)
    t = np.arange(1000, dtype=np.float64)
    v = np.zeros(1000)
    v[537] = 9.0
    x, y, binned = plots._envelope(t, v)
    assert binned and x.size <= 10
    assert y.max() == 9.0


def test_progress_disabled_off_terminal_and_when_quiet() -> None:
    off = Console(file=io.StringIO())
    with replay_progress("fcfs", 10.0, console=off) as bar:
        bar.update(5.0, finished=1)
        bar.advance(1.0)
    assert not bar.enabled
    out = io.StringIO()
    tty = Console(file=out, force_terminal=True)
    with replay_progress("fcfs", 10.0, console=tty, quiet=True) as bar:
        bar.advance(1.0)
    assert not bar.enabled
    assert out.getvalue() == ""


def test_progress_on_a_terminal() -> None:
    out = io.StringIO()
    tty = Console(file=out, force_terminal=True, width=100)
    with replay_progress("lvf", 10.0, requests=4, console=tty, delay_s=0.0) as bar:
        assert bar.enabled
        bar.update(5.0, finished=1)
        assert bar.fraction() == pytest.approx(0.25)
        bar.update(12.0, finished=4)
        assert bar.fraction() == 1.0
    text = out.getvalue()
    assert "lvf" in text
    assert "4/4 req" in text
