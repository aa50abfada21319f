"""The replay simulator as a load -> (TTFT, TBT, memory) oracle."""

from __future__ import annotations

import pytest

from planner.domain.requests import Slo
from planner.replay.oracle import evaluate, workload
from planner.trace.records import TraceRequest

PROFILE = "llama-3-8b@h100-sxm-80gb"
SLO = Slo(ttft_s=1.0, tbt_s=0.1)


def test_deterministic_for_a_seed():
    a = evaluate(PROFILE, 8.0, SLO, duration_s=5, seed=3)
    b = evaluate(PROFILE, 8.0, SLO, duration_s=5, seed=3)
    assert a == b
    assert a.requests > 0
    assert evaluate(PROFILE, 8.0, SLO, duration_s=5, seed=4) != a


def test_attainment_falls_and_memory_rises_with_rate():
    points = [evaluate(PROFILE, r, SLO, duration_s=8) for r in (2.0, 8.0, 40.0)]
    ttft = [p.ttft_attainment for p in points]
    assert ttft[0] == 1.0
    assert ttft[0] >= ttft[1] >= ttft[2]
    assert ttft[2] < 0.9
    peak = [p.peak_kv_bytes for p in points]
    mean = [p.mean_kv_bytes for p in points]
    assert peak[0] < peak[1] < peak[2]
    assert mean[0] < mean[1] < mean[2]
    # KV never exceeds what HBM leaves after the weights.
    p = points[-1]
    assert p.peak_kv_bytes <= p.hbm_bytes - p.weight_bytes


def test_lengths_resampled_from_given_requests():
    reqs = [TraceRequest(0.0, 100, 10), TraceRequest(0.0, 200, 20)]
    trace = workload(4.0, 5.0, seed=0, requests=reqs)
    assert trace and {(t.prompt_tokens, t.output_tokens) for t in trace} <= {(100, 10), (200, 20)}
    # Short requests use less KV than sharegpt's at the same rate.
    short = evaluate(PROFILE, 4.0, SLO, duration_s=5, requests=reqs)
    assert short.peak_kv_bytes < evaluate(PROFILE, 4.0, SLO, duration_s=5).peak_kv_bytes


def test_bad_rate_is_named():
    with pytest.raises(ValueError, match="rate_rps"):
        evaluate(PROFILE, 0.0, SLO)
