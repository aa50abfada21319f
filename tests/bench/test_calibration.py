"""The calibration bench's arithmetic (the run itself needs vLLM: tests/e2e):
the client's records through the replay's own metric code, the trace they
make, vLLM's histograms as quantiles, relative errors, the targets and the
table."""

from __future__ import annotations

import json
import math

import pytest

from planner.bench.calibration import (
    ENGINE_ROWS,
    MEASUREMENTS,
    METRICS,
    Calibration,
    Measurement,
    ServedRun,
    Settings,
    Side,
    bunched_fraction,
    engine_view,
    gain_sign,
    histogram_quantile,
    load_measurement,
    markdown,
    measured_metrics,
    read_metrics,
    relative_error,
    run_trace,
    save_measurement,
    stream_fit_error,
    targets,
    with_stream_work,
)
from planner.bench.calibration_loads import LOADS, QUICK_LOADS
from planner.bench.openai_stream import StreamRecord


def _record(i: int, sent: float, times: list[float], prompt: int = 50) -> StreamRecord:
    return StreamRecord(
        id=f"r{i}",
        send_at_s=sent,
        max_tokens=len(times),
        sent_s=sent,
        prompt_tokens=prompt,
        completion_tokens=len(times),
        token_times_s=times,
        finish_reason="length",
    )


def test_the_clients_view_goes_through_the_replays_metrics():
    records = [
        _record(0, 0.0, [0.10, 0.12, 0.14]),
        _record(1, 0.5, [0.70, 0.70, 0.75]),  # two tokens in one read: a 0 s gap
    ]
    m = measured_metrics(records, Settings(slo_ttft_s=0.15, slo_tbt_s=0.03), {}, "vllm")
    assert m.ttft_s.p50 == pytest.approx((0.10 + 0.20) / 2)
    assert m.tbt_s.count == 4
    assert m.tbt_s.p50 == pytest.approx(0.02)
    assert m.throughput_tok_s == pytest.approx(6 / 0.75)
    # r0 meets both SLOs; r1's TTFT (0.2 s) misses.
    assert m.both_attainment == pytest.approx(0.5)
    read = read_metrics(m)
    assert set(read) == {key for key, _, _ in METRICS}


def test_bunched_gaps_are_tokens_read_together():
    records = [_record(0, 0.0, [0.1, 0.1, 0.1001, 0.2]), _record(1, 0.0, [0.3])]
    assert bunched_fraction(records) == pytest.approx(2 / 3)
    assert bunched_fraction([_record(0, 0.0, [0.1])]) == 0.0


def test_the_trace_is_the_run_as_sent():
    records = [_record(1, 0.3, [0.5], prompt=70), _record(0, 0.1, [0.2, 0.3], prompt=9)]
    trace = run_trace(records)
    assert [t.id for t in trace] == ["r0", "r1"]
    assert [t.arrival_s for t in trace] == [0.1, 0.3]
    assert [t.prompt_tokens for t in trace] == [9, 70]
    assert [t.output_tokens for t in trace] == [2, 1]


def test_histogram_quantile_interpolates_within_the_bucket():
    counters = {
        "engine_tbt le=0.001": 0.0,
        "engine_tbt le=0.002": 50.0,
        "engine_tbt le=0.004": 100.0,
        "engine_tbt le=+Inf": 100.0,
        "preemptions": 3.0,
    }
    assert histogram_quantile(counters, "engine_tbt", 0.5) == pytest.approx(0.002)
    assert histogram_quantile(counters, "engine_tbt", 0.25) == pytest.approx(0.0015)
    assert histogram_quantile(counters, "engine_tbt", 0.99) == pytest.approx(0.00396)
    assert histogram_quantile(counters, "engine_ttft", 0.5) is None
    empty = dict.fromkeys(counters, 0.0)
    assert histogram_quantile(empty, "engine_tbt", 0.5) is None


def test_predicting_again_keeps_the_measurement_and_takes_the_new_prediction_choices():
    measured = Settings(gpu_kv_blocks=64, slo_ttft_s=0.5, quick=True, stream_work="token")
    asked = Settings(
        gpu_kv_blocks=256, stream_work="none", step_jitter="profile", fit_load="bursts"
    )
    again = measured.with_prediction_of(asked)
    assert (again.gpu_kv_blocks, again.slo_ttft_s, again.quick) == (64, 0.5, True)
    assert (again.stream_work, again.step_jitter, again.fit_load) == ("none", "profile", "bursts")
    assert again.planning_cost == asked.planning_cost


def test_relative_error():
    assert relative_error(2.0, 2.2) == pytest.approx(0.1)
    assert relative_error(2.0, 1.0) == pytest.approx(-0.5)
    assert relative_error(0.0, 1.0) is None
    assert relative_error(None, 1.0) is None
    assert relative_error(1.0, math.nan) is None


def _side(load: str, side: str, measured: dict, predicted: dict) -> Side:
    return Side(
        load=load,
        side=side,
        policy="fcfs-vllm" if side == "vllm" else "lvf",
        repeat=0,
        measured=measured,
        predicted=predicted,
        requests=10,
        failed=0,
        merged_chunks=0,
        bunched_gaps=0.25,
        wall_s=1.0,
        load_average_before=1.0,
        load_average_after=1.0,
    )


def _numbers(scale: float, goodput: float) -> dict:
    values = {key: scale for key, _, _ in METRICS}
    values.update({key: scale for key, _, _ in ENGINE_ROWS})
    values["goodput"] = goodput
    return values


def test_targets_and_the_table():
    sides = [
        _side("bursts", "vllm", _numbers(1.0, 80.0), _numbers(1.05, 82.0)),
        _side("bursts", "rotation", _numbers(1.0, 90.0), _numbers(1.3, 87.0)),
    ]
    verdicts = {what: met for what, met, _ in targets(sides, ["bursts"])}
    assert all(met for what, met in verdicts.items() if "vLLM" in what)
    # Measured +10 points, predicted +5: same sign, 5 points apart.
    assert verdicts["bursts: rotation's goodput gain, same sign and within 10 points"]
    sides[1].predicted["goodput"] = 81.5  # +0.5 predicted: no gain against +10
    verdicts = {what: met for what, met, _ in targets(sides, ["bursts"])}
    assert not verdicts["bursts: rotation's goodput gain, same sign and within 10 points"]
    sides[0].predicted["tbt_p99_s"] = 1.2
    missed = [what for what, met, _ in targets(sides, ["bursts"]) if met is False]
    assert "bursts: vLLM TBT p99 s (client) within 10 %" in missed
    assert not any("engine" in what for what in missed)
    sides[0].predicted["engine_tbt_p99_s"] = 0.8
    missed = [what for what, met, _ in targets(sides, ["bursts"]) if met is False]
    assert "bursts: vLLM TBT p99 s, vLLM's own (engine core) (engine) within 10 %" in missed
    cal = Calibration(Settings(), sides, [], {"git": {"commit": "abc"}}, "planner bench x")
    text = markdown(cal, [LOADS["bursts"]])
    assert "| TBT p99 s | 1.000 | 1.200 | +20 % |" in text
    assert "**MISSED** (+20.0 %)" in text
    assert "rotation's goodput gain, points | +10.0 measured | -0.5 predicted" in text


def test_gain_sign_has_a_dead_zone():
    assert gain_sign(0.4) == 0 and gain_sign(-0.9) == 0
    assert gain_sign(3.0) == 1 and gain_sign(-2.0) == -1


@pytest.mark.parametrize("table", [LOADS, QUICK_LOADS])
def test_loads_keep_their_lengths_whatever_the_salt(table):
    for load in table.values():
        a, b = load.requests(salt=1), load.requests(salt=2)
        assert [r.max_tokens for r in a] == [r.max_tokens for r in b]
        assert [r.send_at_s for r in a] == [r.send_at_s for r in b]
        assert [len(r.prompt.split()) for r in a] == [len(r.prompt.split()) for r in b]
        assert all(x.prompt != y.prompt for x, y in zip(a, b, strict=True))
        assert len({r.prompt for r in a}) == len(a)


def test_the_engine_view_of_the_replay_leaves_the_request_latency_out_of_ttft():
    replayed = {key: 0.05 for key, _, _ in METRICS}
    view = engine_view(replayed, 0.02)
    assert view["engine_ttft_p50_s"] == pytest.approx(0.03)
    assert view["engine_ttft_p99_s"] == pytest.approx(0.03)
    assert view["engine_tbt_p50_s"] == 0.05
    assert engine_view(replayed, 0.08)["engine_ttft_p50_s"] == 0.0


def test_a_saved_measurement_loads_back_as_it_was(tmp_path):
    runs = [
        ServedRun(
            load=LOADS["bursts"],
            side=side,
            repeat=1,
            records=[_record(0, 0.0, [0.10, 0.12]), _record(1, 0.2, [0.3])],
            counters={"preemptions": 3.0, "engine_tbt le=0.001": 5.0},
            wall_s=11.5,
            load_average_before=2.0,
            load_average_after=None,
        )
        for side in ("vllm", "rotation")
    ]
    m = Measurement(
        Settings(gpu_kv_blocks=64, per_request="iteration"),
        runs,
        [{"repeat": 1, "path": str(tmp_path / "profile-1.json")}],
        {"cpu": "x"},
        "planner bench calibration --repeat 2",
        tmp_path,
    )
    save_measurement(m, tmp_path)
    again = load_measurement(tmp_path)
    assert again == m
    (tmp_path / MEASUREMENTS).unlink()
    with pytest.raises(ValueError, match="no measurement"):
        load_measurement(tmp_path)


def test_the_streaming_fit_weighs_the_ttft_median_and_p90_alike():
    measured = {"ttft_p50_s": 0.02, "ttft_p90_s": 0.06}
    assert stream_fit_error(measured, dict(measured)) == 0.0
    # Twice the median and half the tail: log 2 each.
    off = {"ttft_p50_s": 0.04, "ttft_p90_s": 0.03}
    assert stream_fit_error(measured, off) == pytest.approx(2 * math.log(2))
    assert stream_fit_error(measured, {**off, "ttft_p90_s": None}) == math.inf


def test_the_streaming_work_goes_on_every_cost_entry(tmp_path):
    src = tmp_path / "p.json"
    src.write_text('{"name": "x", "cost": [{"model": "a"}, {"model": "b"}]}', encoding="utf-8")
    out = tmp_path / "q.json"
    with_stream_work(src, 0.0012, out)
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert [e["stream_s_per_token"] for e in doc["cost"]] == [0.0012, 0.0012]
    assert doc["name"] == "x"
