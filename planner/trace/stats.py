"""Statistics of a trace: size, rate, burstiness, lengths, models.

Definitions:
- span_s = last arrival - first arrival.
- mean_rate_rps = (n - 1) / span_s, the inverse of the mean gap between
  consecutive arrivals (None when span_s is 0).
- interarrival_cv (burstiness) = std / mean of those gaps (population std;
  1 for Poisson arrivals, 0 for evenly spaced ones).
- window rates: arrivals counted in windows [k·W, (k+1)·W) of trace time,
  from 0 to the last arrival; only full windows are listed (the partial one
  at the end would misstate a rate). W is 60 s unless given, or shorter for
  a trace shorter than 10 minutes (see default_window_s).
- length percentiles: numpy's linear interpolation between order statistics.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from planner.trace.records import TraceRequest


@dataclass(frozen=True, slots=True)
class LengthStats:
    mean: float
    p50: float
    p90: float
    p99: float
    min: int
    max: int
    total: int


@dataclass(frozen=True, slots=True)
class WindowRates:
    window_s: float
    rates_rps: tuple[float, ...]  # one per full window, in time order

    @property
    def min_rps(self) -> float | None:
        return min(self.rates_rps) if self.rates_rps else None

    @property
    def median_rps(self) -> float | None:
        return float(np.median(self.rates_rps)) if self.rates_rps else None

    @property
    def max_rps(self) -> float | None:
        return max(self.rates_rps) if self.rates_rps else None


@dataclass(frozen=True, slots=True)
class TraceStats:
    requests: int
    first_arrival_s: float
    last_arrival_s: float
    span_s: float
    mean_rate_rps: float | None
    interarrival_cv: float | None
    windows: WindowRates
    prompt: LengthStats
    output: LengthStats
    prompt_tokens_per_s: float | None
    output_tokens_per_s: float | None
    models: dict[str, int]  # requests per model, most first; empty when none named
    tenants: dict[str, int]
    with_prefix_blocks: int
    with_slo: int


def _lengths(values: Sequence[int]) -> LengthStats:
    arr = np.asarray(values, dtype=np.float64)
    p50, p90, p99 = (float(x) for x in np.percentile(arr, [50, 90, 99]))
    return LengthStats(
        mean=float(arr.mean()),
        p50=p50,
        p90=p90,
        p99=p99,
        min=int(min(values)),
        max=int(max(values)),
        total=int(sum(values)),
    )


def _window_rates(arrivals: np.typing.NDArray[np.float64], window_s: float) -> WindowRates:
    full = math.floor(float(arrivals[-1]) / window_s)
    counts = np.bincount(
        np.minimum((arrivals // window_s).astype(np.int64), full), minlength=full + 1
    )[:full]
    return WindowRates(window_s, tuple(float(c) / window_s for c in counts))


def _counts(names: Sequence[str | None]) -> dict[str, int]:
    counter = Counter(n for n in names if n is not None)
    return dict(sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))


_WINDOW_CHOICES_S = (1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0)


def default_window_s(last_arrival_s: float) -> float:
    """60 s, or for a trace shorter than 10 minutes the largest of 1, 2, 5,
    10, 15, 30 s that still gives ten full windows (1 s at least)."""
    fits = [w for w in _WINDOW_CHOICES_S if 10 * w <= last_arrival_s]
    return fits[-1] if fits else _WINDOW_CHOICES_S[0]


def compute_stats(requests: Sequence[TraceRequest], window_s: float | None = None) -> TraceStats:
    """Statistics of a non-empty trace in arrival order; window_s None picks
    default_window_s."""
    if not requests:
        raise ValueError("a trace with no requests has no statistics")
    if window_s is None:
        window_s = default_window_s(requests[-1].arrival_s)
    if not (math.isfinite(window_s) and window_s > 0):
        raise ValueError(f"window_s must be > 0, got {window_s}")
    arrivals = np.asarray([r.arrival_s for r in requests], dtype=np.float64)
    gaps = np.diff(arrivals)
    span = float(arrivals[-1] - arrivals[0])
    mean_gap = float(gaps.mean()) if len(gaps) else 0.0
    prompt = _lengths([r.prompt_tokens for r in requests])
    output = _lengths([r.output_tokens for r in requests])
    return TraceStats(
        requests=len(requests),
        first_arrival_s=float(arrivals[0]),
        last_arrival_s=float(arrivals[-1]),
        span_s=span,
        mean_rate_rps=(len(requests) - 1) / span if span > 0 else None,
        interarrival_cv=float(gaps.std() / mean_gap) if mean_gap > 0 else None,
        windows=_window_rates(arrivals, window_s),
        prompt=prompt,
        output=output,
        prompt_tokens_per_s=prompt.total / span if span > 0 else None,
        output_tokens_per_s=output.total / span if span > 0 else None,
        models=_counts([r.model for r in requests]),
        tenants=_counts([r.tenant for r in requests]),
        with_prefix_blocks=sum(1 for r in requests if r.prefix_block_ids),
        with_slo=sum(1 for r in requests if r.slo_ttft_s is not None or r.slo_tbt_s is not None),
    )


def stats_to_json(stats: TraceStats) -> dict[str, object]:
    """A JSON-ready dict of the statistics (window rates included)."""
    obj = asdict(stats)
    obj["windows"] = {
        "window_s": stats.windows.window_s,
        "full_windows": len(stats.windows.rates_rps),
        "min_rps": stats.windows.min_rps,
        "median_rps": stats.windows.median_rps,
        "max_rps": stats.windows.max_rps,
        "rates_rps": list(stats.windows.rates_rps),
    }
    return obj
