"""Statistics on a tiny hand-made trace, every number checked by hand."""

from __future__ import annotations

import pytest

from planner.trace import TraceRequest
from planner.trace.stats import compute_stats, default_window_s, stats_to_json
from planner.trace.stats_table import render_stats

TRACE = [
    TraceRequest(0.0, 10, 1, model="a"),
    TraceRequest(1.0, 20, 1, model="a"),
    TraceRequest(2.0, 30, 1, model="b", slo_ttft_s=1.0),
    TraceRequest(4.0, 40, 1, tenant="t"),
    TraceRequest(8.0, 100, 5, prefix_block_ids=(1,)),
]


def test_numbers_by_hand() -> None:
    s = compute_stats(TRACE, window_s=2.0)
    assert s.requests == 5
    assert (s.first_arrival_s, s.last_arrival_s, s.span_s) == (0.0, 8.0, 8.0)
    assert s.mean_rate_rps == 0.5  # 4 gaps over 8 s
    # gaps 1, 1, 2, 4: mean 2, population std sqrt(1.5)
    assert s.interarrival_cv == pytest.approx(1.5**0.5 / 2)
    # windows [0,2) [2,4) [4,6) [6,8): 2, 1, 1, 0 arrivals; 8.0 is in no full window
    assert s.windows.rates_rps == (1.0, 0.5, 0.5, 0.0)
    assert (s.windows.min_rps, s.windows.median_rps, s.windows.max_rps) == (0.0, 0.5, 1.0)
    # prompts 10 20 30 40 100: p90 at rank 3.6 → 40 + 0.6·60, p99 at 3.96
    assert (s.prompt.mean, s.prompt.p50, s.prompt.min, s.prompt.max) == (40.0, 30.0, 10, 100)
    assert s.prompt.p90 == pytest.approx(76.0)
    assert s.prompt.p99 == pytest.approx(97.6)
    assert (s.output.mean, s.output.p50, s.output.total) == (1.8, 1.0, 9)
    assert s.prompt_tokens_per_s == 200 / 8
    assert s.models == {"a": 2, "b": 1}
    assert s.tenants == {"t": 1}
    assert (s.with_prefix_blocks, s.with_slo) == (1, 1)


def test_json_and_table() -> None:
    s = compute_stats(TRACE, window_s=2.0)
    obj = stats_to_json(s)
    assert obj["requests"] == 5
    assert obj["windows"] == {
        "window_s": 2.0,
        "full_windows": 4,
        "min_rps": 0.0,
        "median_rps": 0.5,
        "max_rps": 1.0,
        "rates_rps": [1.0, 0.5, 0.5, 0.0],
    }
    assert obj["prompt"]["p90"] == pytest.approx(76.0)  # type: ignore[index]
    text = render_stats(s, "trace tiny")
    assert "0.500 rps" in text and "0.612" in text  # mean rate, CV
    assert "models (2)" in text
    assert all(line == line.rstrip() for line in text.splitlines())


def test_single_request_and_simultaneous_arrivals() -> None:
    one = compute_stats([TraceRequest(3.0, 5, 5)])
    assert (one.mean_rate_rps, one.interarrival_cv, one.span_s) == (None, None, 0.0)
    # default window for a 3 s trace: 1 s; three full windows before 3.0, empty
    assert (one.windows.window_s, one.windows.rates_rps) == (1.0, (0.0, 0.0, 0.0))
    same = compute_stats([TraceRequest(1.0, 5, 5), TraceRequest(1.0, 5, 5)])
    assert same.mean_rate_rps is None and same.interarrival_cv is None
    assert "-" in render_stats(same, "t")
    with pytest.raises(ValueError):
        compute_stats([])


def test_default_window() -> None:
    assert default_window_s(3600.0) == 60.0
    assert default_window_s(600.0) == 60.0
    assert default_window_s(120.0) == 10.0
    assert default_window_s(3.0) == 1.0
