"""Fitting the cost model to measured times: NNLS, the relative fit, and the
whole profile fit through the replay engine recovering constants that
generated the "measurements"."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.bench.engine_profile import (
    DECODE_PROBES,
    PREFILL_PROBES,
    EngineLimits,
    Probe,
    ProbeRun,
    fit_probes,
    probe_engine,
    probe_trace,
)
from planner.bench.openai_stream import StreamRecord
from planner.profiles.fit import FIT_TERMS, LinearCost, fit_costs, nnls

LIMITS = EngineLimits(
    block_size_tokens=32,
    gpu_kv_blocks=512,
    max_batched_tokens=2048,
    max_running=128,
    max_model_len=1024,
)
TRUE = LinearCost(
    overhead_s=2.5e-3,
    prefill_s_per_token=60e-6,
    decode_s_per_token=180e-6,
    attn_s_per_context_token=40e-9,
    prefill_s_per_sequence=300e-6,
)
LATENCY_S = 0.012


def test_nnls_matches_least_squares_when_the_optimum_is_positive():
    rng = np.random.default_rng(1)
    a = rng.uniform(0.1, 1.0, (30, 4))
    x = np.array([1.0, 2.0, 0.5, 3.0])
    assert np.allclose(nnls(a, a @ x), x)


def test_nnls_clamps_a_coefficient_the_data_wants_negative():
    # b = 2 * a0 - 1 * a1: the best non-negative fit drops a1 and fits a0 alone.
    a = np.array([[1.0, 0.0], [1.0, 1.0], [2.0, 1.0], [3.0, 2.0]])
    b = a @ np.array([2.0, -1.0])
    x = nnls(a, b)
    assert x[1] == 0.0
    only = np.linalg.lstsq(a[:, :1], b, rcond=None)[0][0]
    assert x[0] == pytest.approx(only)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.floats(0.0, 10.0), min_size=3, max_size=3), min_size=4, max_size=12),
    st.lists(st.floats(-5.0, 5.0), min_size=4, max_size=12),
)
def test_nnls_is_non_negative_and_satisfies_the_kkt_conditions(rows, targets):
    a = np.array(rows)
    b = np.array(targets[: len(rows)] + [0.0] * (len(rows) - len(targets)))
    x = nnls(a, b)
    assert (x >= 0).all()
    gradient = a.T @ (b - a @ x)
    scale = 1e-7 * (1 + np.abs(a).sum() * (1 + np.abs(b).sum()))
    # Where x > 0 the gradient vanishes; where x == 0 it points down.
    assert np.all(np.abs(gradient[x > 0]) <= scale)
    assert np.all(gradient[x == 0] <= scale)


def _rows_for(cost: LinearCost, n: int, seed: int) -> tuple[list[list[float]], list[float]]:
    rng = random.Random(seed)
    rows, times = [], []
    for _ in range(n):
        k = rng.randint(1, 200)
        p = rng.randint(0, 4000)
        d = rng.randint(0, 64 * k)
        a = rng.randint(d, 500 * k)
        q = rng.randint(0, min(p, 64))
        rows.append([k, p, d, a, q])
        times.append(
            LATENCY_S
            + cost.overhead_s * k
            + cost.prefill_s_per_token * p
            + cost.decode_s_per_token * d
            + cost.attn_s_per_context_token * a
            + cost.prefill_s_per_sequence * q
        )
    return rows, times


def test_fit_costs_recovers_exact_constants():
    rows, times = _rows_for(TRUE, 40, seed=3)
    fit = fit_costs(rows, times)
    assert fit.latency_s == pytest.approx(LATENCY_S, rel=1e-6)
    for name, value in TRUE.constants().items():
        assert fit.cost.constants()[name] == pytest.approx(value, rel=1e-6, abs=1e-15), name
    assert fit.dropped == 0
    assert fit.median_abs_error < 1e-9


def test_fit_costs_solves_a_hand_made_system_exactly():
    # Six times, six unknowns: 1 ms latency, 2 ms per iteration, 10 us per
    # prefill token, 100 us per decode token, 1 us per attended token, 0.5 ms
    # per prefilling sequence.
    rows = [
        [1, 0, 0, 0, 0],
        [1, 100, 0, 0, 0],
        [1, 0, 10, 0, 0],
        [1, 0, 0, 1000, 0],
        [1, 0, 0, 0, 2],
        [3, 200, 20, 500, 4],
    ]
    times = [0.003, 0.004, 0.004, 0.004, 0.004, 0.001 + 0.006 + 0.002 + 0.002 + 0.0005 + 0.002]
    fit = fit_costs(rows, times)
    assert fit.latency_s == pytest.approx(0.001, rel=1e-9)
    assert fit.cost.constants() == pytest.approx(
        LinearCost(0.002, 10e-6, 100e-6, 1e-6, 0.5e-3).constants(), rel=1e-9
    )
    assert fit.rows == 6 and fit.dropped == 0


def test_fit_costs_gives_zero_to_a_term_the_times_do_not_pay_for():
    free_attention = LinearCost(2.5e-3, 60e-6, 180e-6, 0.0, 300e-6)
    rows, times = _rows_for(free_attention, 30, seed=6)
    fit = fit_costs(rows, times)
    assert fit.cost.attn_s_per_context_token == pytest.approx(0.0, abs=1e-15)
    assert fit.cost.decode_s_per_token == pytest.approx(180e-6, rel=1e-6)
    # A term no row exercises is 0, the others exact.
    rows = [[k, p, d, 0, 0] for k, p, d, _, _ in rows]
    times = [
        LATENCY_S + TRUE.overhead_s * k + TRUE.prefill_s_per_token * p + TRUE.decode_s_per_token * d
        for k, p, d, _, _ in rows
    ]
    fit = fit_costs(rows, times)
    assert fit.cost.attn_s_per_context_token == 0.0
    assert fit.cost.prefill_s_per_sequence == 0.0
    assert fit.cost.prefill_s_per_token == pytest.approx(TRUE.prefill_s_per_token, rel=1e-6)


@settings(max_examples=40, deadline=None)
@given(
    st.floats(0.0, 0.05),
    st.floats(1e-4, 0.02),
    st.floats(1e-6, 1e-3),
    st.floats(1e-6, 1e-3),
    st.floats(0.0, 1e-6),
    st.floats(0.0, 1e-3),
    st.integers(0, 1000),
)
def test_fit_costs_recovers_any_non_negative_constants(
    latency, overhead, prefill, decode, attn, per_sequence, seed
):
    true = LinearCost(overhead, prefill, decode, attn, per_sequence)
    rows, _ = _rows_for(true, 25, seed=seed)
    times = [
        latency + overhead * k + prefill * p + decode * d + attn * a + per_sequence * q
        for k, p, d, a, q in rows
    ]
    fit = fit_costs(rows, times)
    assert fit.dropped == 0
    # Exact up to the conditioning of the system: every time is reproduced.
    assert np.abs(fit.relative_errors).max() < 1e-7
    assert fit.cost.overhead_s == pytest.approx(overhead, rel=1e-4, abs=1e-9)
    assert fit.cost.decode_s_per_token == pytest.approx(decode, rel=1e-4, abs=1e-11)


def test_fit_costs_drops_times_a_busy_machine_stretched():
    rows, times = _rows_for(TRUE, 60, seed=4)
    for i in (5, 17, 41):
        times[i] *= 3.0
    fit = fit_costs(rows, times)
    assert fit.dropped == 3
    assert fit.cost.decode_s_per_token == pytest.approx(TRUE.decode_s_per_token, rel=1e-6)


def test_fit_costs_refuses_too_few_times_and_bad_ones():
    rows, times = _rows_for(TRUE, len(FIT_TERMS), seed=5)
    with pytest.raises(ValueError, match="at least"):
        fit_costs(rows[:-1], times[:-1])
    with pytest.raises(ValueError, match="> 0"):
        fit_costs(rows, [0.0, *times[1:]])
    with pytest.raises(ValueError, match="columns"):
        fit_costs([r[:3] for r in rows], times)
    with pytest.raises(ValueError, match="one measured time per row"):
        fit_costs(rows, times[:-1])
    with pytest.raises(ValueError, match="> 0"):
        fit_costs(rows, [*times[:-1], float("nan")])
    with pytest.raises(ValueError, match="> 0"):
        fit_costs(rows, [*times[:-1], -1.0])


@pytest.mark.parametrize(
    ("column", "value", "term"),
    [
        (0, -1.0, "overhead_s"),
        (1, float("nan"), "prefill_s_per_token"),
        (2, float("inf"), "decode_s_per_token"),
        (3, -5.0, "attn_s_per_context_token"),
        (4, -1.0, "prefill_s_per_sequence"),
    ],
)
def test_fit_costs_names_the_row_and_term_of_a_bad_count(column, value, term):
    rows, times = _rows_for(TRUE, 8, seed=7)
    rows[6][column] = value
    with pytest.raises(ValueError, match=f"row 6: the count multiplying {term}"):
        fit_costs(rows, times)


def _measured_run(probe: Probe, repeat: int, send_gaps_s: float, seed: int) -> ProbeRun:
    """What a client would record of probe on an engine that takes exactly
    TRUE per iteration, LATENCY_S after each token (requests sent
    send_gaps_s apart, as a client writes them one after another)."""
    rng = random.Random(seed)
    records = []
    for i in range(probe.batch):
        tokens = int(probe.prompt_words * 1.3) + rng.randint(0, 5)
        records.append(
            StreamRecord(
                id=f"{probe.name}-{i}",
                send_at_s=0.0,
                max_tokens=probe.output_tokens,
                sent_s=1.0 + i * send_gaps_s,
                prompt_tokens=tokens,
                finish_reason="length",
            )
        )
    trace, t0 = probe_trace(records)
    outcomes = {o.id: o for o in probe_engine(trace, TRUE, LIMITS).run().requests}
    for record in records:
        times = outcomes[record.id].token_times_s
        record.token_times_s = [t0 + t + LATENCY_S for t in times]
        record.completion_tokens = len(times)
    return ProbeRun(probe, repeat, records, load_average=None)


def test_the_profile_fit_recovers_the_engine_that_produced_the_times():
    probes = [p for p in (*DECODE_PROBES, *PREFILL_PROBES) if LIMITS.fitted(p) == p]
    runs = [
        _measured_run(p, repeat=0, send_gaps_s=0.0005 * (k % 3), seed=k)
        for k, p in enumerate(probes)
    ]
    fit, rounds = fit_probes(runs, LIMITS)
    assert rounds <= 3
    assert fit.latency_s == pytest.approx(LATENCY_S, rel=1e-4)
    for name, value in TRUE.constants().items():
        assert fit.cost.constants()[name] == pytest.approx(value, rel=1e-4, abs=1e-12), name
    assert fit.median_abs_error < 1e-6


def test_a_probe_too_big_for_the_engine_is_cut_to_fit_or_left_out():
    small = EngineLimits(32, 64, 2048, 16, 1024)
    assert small.fitted(Probe(64, 16, 8)) == Probe(16, 16, 8)
    # 300 words take at most 600 tokens + 96: 22 blocks, 2 of them fit in 64.
    assert small.fitted(Probe(8, 300, 96)) == Probe(2, 300, 96)
    assert small.fitted(Probe(1, 700, 1)) is None
