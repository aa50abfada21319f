"""Replay metrics on hand-made outcomes, every number worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from planner.replay.metrics import (
    Distribution,
    PolicyMetrics,
    compare,
    latency_samples,
    summarize,
)
from planner.replay.records import ReplayResult, ReplayTotals, RequestOutcome


def outcome(
    rid: str,
    arrival: float,
    tokens: list[float],
    *,
    finish: float | None,
    slo_ttft: float = 1.0,
    slo_tbt: float = 0.5,
) -> RequestOutcome:
    return RequestOutcome(
        id=rid,
        arrival_s=arrival,
        prompt_tokens=100,
        output_tokens=max(len(tokens), 1),
        slo_ttft_s=slo_ttft,
        slo_tbt_s=slo_tbt,
        token_times_s=list(tokens),
        finish_s=finish,
    )


TOTALS = ReplayTotals(
    iterations=10,
    simulated_s=4.0,
    wall_s=0.5,
    bytes_d2h=1000,
    bytes_h2d=500,
    stall_s=0.5,
    preemptions=2,
    swap_outs=1,
    swap_ins=1,
    peak_gpu_kv_blocks=75,
    gpu_kv_blocks_total=100,
)


def five_requests() -> list[RequestOutcome]:
    """a: TTFT ok, gaps .25 .25 .5 against a .25 SLO, TPOT 1/3 > .25.
    b: TTFT 1.0 against its own .25 SLO; one token (TPOT attained).
    c: unfinished after two tokens: TTFT ok, one gap exactly at the SLO.
    d: unfinished, never a token.
    e: everything attained (TPOT .5 exactly at the SLO)."""
    a = outcome("a", 0.0, [0.5, 0.75, 1.0, 1.5], finish=1.5, slo_tbt=0.25)
    a.recomputed_tokens = 7
    return [
        a,
        outcome("b", 1.0, [2.0], finish=2.0, slo_ttft=0.25),
        outcome("c", 2.0, [2.5, 3.0], finish=None),
        outcome("d", 3.0, [], finish=None),
        outcome("e", 0.25, [0.5, 1.0, 1.5], finish=1.5),
    ]


def result(requests: list[RequestOutcome], policy: str = "lvf") -> ReplayResult:
    return ReplayResult(policy=policy, requests=requests, timeline=[], totals=TOTALS)


def test_attainment_counts_and_fractions() -> None:
    m = summarize(result(five_requests()))
    assert (m.requests, m.finished, m.unfinished) == (5, 3, 2)
    # TTFT: a .5, c .5, e .25 within SLO; b 1.0 > .25; d none.
    assert m.ttft_attained == 3
    assert m.ttft_attainment == pytest.approx(0.6)
    # Gaps: a .25 .25 (ok) .5 (not); c .5; e .5 .5: 5 of 6.
    assert (m.tbt_samples, m.tbt_attained) == (6, 5)
    assert m.tbt_attainment == pytest.approx(5 / 6)
    # TPOT: b (one token) and e; a too slow; c and d unfinished.
    assert m.tpot_attained == 2
    assert m.tpot_attainment == pytest.approx(0.4)
    # Both: only e.
    assert m.both_attained == 1
    assert m.both_attainment == pytest.approx(0.2)


def test_percentiles_interpolate_linearly() -> None:
    m = summarize(result(five_requests()))
    # TTFT samples .25 .5 .5 1.0 (d has none).
    assert m.ttft_s.count == 4
    assert m.ttft_s.p50 == pytest.approx(0.5)
    assert m.ttft_s.p90 == pytest.approx(0.5 + 0.7 * 0.5)
    assert m.ttft_s.p99 == pytest.approx(0.5 + 0.97 * 0.5)
    assert m.ttft_s.mean == pytest.approx(2.25 / 4)
    assert m.ttft_s.max == pytest.approx(1.0)
    # TBT samples .25 .25 .5 .5 .5 .5.
    assert m.tbt_s.count == 6
    assert m.tbt_s.p50 == pytest.approx(0.5)
    assert m.tbt_s.mean == pytest.approx(2.5 / 6)
    # TPOT of a (1/3) and e (1/2); b has one token, c is unfinished.
    assert m.tpot_s.count == 2
    assert m.tpot_s.p50 == pytest.approx(5 / 12)
    assert m.tpot_s.p90 == pytest.approx(1 / 3 + 0.9 / 6)
    assert m.tpot_s.p99 == pytest.approx(1 / 3 + 0.99 / 6)


def test_throughput_and_counters() -> None:
    m = summarize(result(five_requests()))
    # 4 + 1 + 2 + 0 + 3 tokens over first arrival (0) to last token (3.0,
    # of unfinished c; the last finish is 2.0).
    assert m.output_tokens == 10
    assert m.span_s == pytest.approx(3.0)
    assert m.throughput_tok_s == pytest.approx(10 / 3)
    assert m.throughput_req_s == pytest.approx(1.0)
    assert (m.preemptions, m.swap_outs, m.swap_ins) == (2, 1, 1)
    assert m.recomputed_tokens == 7
    assert (m.bytes_d2h, m.bytes_h2d, m.bytes_moved) == (1000, 500, 1500)
    assert m.stall_s == 0.5
    assert m.stall_fraction == pytest.approx(0.125)
    assert (m.peak_gpu_kv_blocks, m.gpu_kv_blocks_total) == (75, 100)
    assert m.peak_gpu_kv_fraction == pytest.approx(0.75)
    assert (m.iterations, m.simulated_s, m.wall_s) == (10, 4.0, 0.5)
    assert m.sim_speed == pytest.approx(8.0)


def test_span_ends_at_last_finish_when_all_finished() -> None:
    reqs = [
        outcome("a", 1.0, [1.5, 2.0], finish=2.25),
        outcome("b", 2.0, [2.5], finish=4.0),
    ]
    m = summarize(result(reqs))
    assert m.span_s == pytest.approx(3.0)
    assert m.throughput_tok_s == pytest.approx(1.0)
    assert m.throughput_req_s == pytest.approx(2 / 3)


def test_slo_comparison_tolerates_float_rounding() -> None:
    # 0.1 + 0.2 - 0.1 is 0.20000000000000004: still within a 0.2 s SLO.
    reqs = [outcome("a", 0.1, [0.1 + 0.2, 0.1 + 0.2 + 0.3], finish=0.6, slo_ttft=0.2, slo_tbt=0.3)]
    m = summarize(result(reqs))
    assert (m.ttft_attainment, m.tbt_attainment, m.tpot_attainment) == (1.0, 1.0, 1.0)
    reqs[0].slo_ttft_s = 0.199
    assert summarize(result(reqs)).ttft_attainment == 0.0


def test_empty_run_has_no_fractions() -> None:
    zero = ReplayTotals(0, 0.0, 0.0, 0, 0, 0.0, 0, 0, 0, 0, 0)
    m = summarize(ReplayResult("fcfs", [], [], zero))
    assert m.requests == 0
    assert m.ttft_attainment is None
    assert m.tbt_attainment is None
    assert m.ttft_s == Distribution(0, None, None, None, None, None)
    assert m.throughput_tok_s is None
    assert m.stall_fraction is None
    assert m.peak_gpu_kv_fraction is None
    assert m.sim_speed is None


def test_all_unfinished_without_tokens() -> None:
    m = summarize(result([outcome("a", 0.0, [], finish=None), outcome("b", 1.0, [], finish=None)]))
    assert (m.finished, m.unfinished) == (0, 2)
    assert (m.ttft_attainment, m.tpot_attainment, m.both_attainment) == (0.0, 0.0, 0.0)
    assert m.tbt_attainment is None
    assert m.ttft_s.count == 0
    assert m.span_s == 0.0
    assert m.throughput_tok_s is None


def test_latency_samples_align_with_requests() -> None:
    s = latency_samples(five_requests())
    np.testing.assert_allclose(s.ttft_s, [0.5, 1.0, 0.5, np.nan, 0.25])
    assert s.ttft_attained.tolist() == [True, False, True, False, True]
    np.testing.assert_allclose(s.tbt_s, [0.25, 0.25, 0.5, 0.5, 0.5, 0.5])
    np.testing.assert_allclose(s.tbt_slo_s, [0.25, 0.25, 0.25, 0.5, 0.5, 0.5])
    assert s.tpot_attained.tolist() == [False, True, False, False, True]
    assert s.tokens.tolist() == [4, 1, 2, 0, 3]


def test_compare_keeps_order_and_json_round_trip() -> None:
    results = [result(five_requests(), "fcfs"), result(five_requests()[:2], "lvf")]
    metrics = compare(results)
    assert [m.policy for m in metrics] == ["fcfs", "lvf"]
    for m in metrics:
        assert PolicyMetrics.from_json(m.to_json()) == m
