"""Latency statistics of one measured case: median, p99, mean, max."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

NS_PER_MS = 1e6


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Milliseconds over `calls` timed calls (warm-up excluded).

    Percentiles interpolate linearly between order statistics (numpy's
    default), so with 200 calls p99 lies between the two largest samples.
    """

    calls: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    min_ms: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> LatencyStats:
        return LatencyStats(
            calls=int(data["calls"]),
            p50_ms=float(data["p50_ms"]),
            p99_ms=float(data["p99_ms"]),
            mean_ms=float(data["mean_ms"]),
            max_ms=float(data["max_ms"]),
            min_ms=float(data["min_ms"]),
        )


def summarize(samples_ns: Sequence[int]) -> LatencyStats:
    if not samples_ns:
        raise ValueError("no samples")
    ms = np.asarray(samples_ns, dtype=np.float64) / NS_PER_MS
    p50, p99 = np.percentile(ms, [50.0, 99.0])
    return LatencyStats(
        calls=len(samples_ns),
        p50_ms=float(p50),
        p99_ms=float(p99),
        mean_ms=float(ms.mean()),
        max_ms=float(ms.max()),
        min_ms=float(ms.min()),
    )
