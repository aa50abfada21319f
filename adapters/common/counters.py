"""What the planner link did: calls, answers used, fallbacks by reason, call
latency and how long the engine waited for answers. A plain snapshot for
tests and logs, optional Prometheus metrics for scraping."""

from __future__ import annotations

import enum
import math
import threading
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram

# Planner calls are meant to answer within a few milliseconds.
LATENCY_BUCKETS_S = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.1,
)  # fmt: skip
# A pipelined step usually waits nothing at all.
WAIT_BUCKETS_S = (0.0, *LATENCY_BUCKETS_S)


class FallbackReason(enum.StrEnum):
    DEADLINE = "deadline"
    UNAVAILABLE = "unavailable"
    ERROR = "error"
    INVALID_PLAN = "invalid-plan"
    # Pipelined: a plan right for the snapshot it answered that no longer
    # fits the engine when it arrives (a request it names has finished).
    STALE_PLAN = "stale-plan"


@dataclass(frozen=True, slots=True)
class LatencySummary:
    count: int = 0
    total_s: float = 0.0
    max_s: float = 0.0

    @property
    def mean_s(self) -> float:
        return self.total_s / self.count if self.count else math.nan


@dataclass(frozen=True, slots=True)
class CountersSnapshot:
    calls: int
    ok: int
    fallbacks: dict[FallbackReason, int]
    # From sending a call to its end (answer, error or cut).
    latency: LatencySummary
    # What the engine's step waited for answers: the whole call when the
    # engine asks synchronously, what is left of it at the next step when
    # the call is pipelined.
    wait: LatencySummary = LatencySummary()

    @property
    def total_fallbacks(self) -> int:
        return sum(self.fallbacks.values())


@dataclass(slots=True)
class _Prometheus:
    calls: Counter
    ok: Counter
    fallbacks: Counter
    latency: Histogram
    wait: Histogram


class FallbackCounters:
    """Thread-safe. With a registry, the same numbers are also exported as
    planner_adapter_* metrics under the given engine label."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        engine: str = "engine",
        keep_latencies: bool = False,
    ) -> None:
        """keep_latencies: also keep each call's latency and each wait until
        drain_latencies() / drain_waits() take them (for an engine's own
        metrics path)."""
        self._lock = threading.Lock()
        self._recent: list[float] | None = [] if keep_latencies else None
        self._recent_waits: list[float] | None = [] if keep_latencies else None
        self._calls = 0
        self._ok = 0
        self._fallbacks = dict.fromkeys(FallbackReason, 0)
        self._latency = LatencySummary()
        self._wait = LatencySummary()
        self._engine = engine
        self._prom = _prometheus(registry) if registry is not None else None

    def record_call(self, seconds: float) -> None:
        """One planner call that ended (answered or not) after `seconds`."""
        with self._lock:
            self._calls += 1
            self._latency = _add(self._latency, seconds)
            if self._recent is not None:
                self._recent.append(seconds)
        if self._prom is not None:
            self._prom.calls.labels(self._engine).inc()
            self._prom.latency.labels(self._engine).observe(seconds)

    def record_wait(self, seconds: float) -> None:
        """An engine step waited `seconds` for a planner answer."""
        with self._lock:
            self._wait = _add(self._wait, seconds)
            if self._recent_waits is not None:
                self._recent_waits.append(seconds)
        if self._prom is not None:
            self._prom.wait.labels(self._engine).observe(seconds)

    def record_ok(self) -> None:
        """A call answered in time with a plan (it may still be rejected as
        invalid-plan by the adapter)."""
        with self._lock:
            self._ok += 1
        if self._prom is not None:
            self._prom.ok.labels(self._engine).inc()

    def record_fallback(self, reason: FallbackReason) -> None:
        """A step that ran on the engine's own policy instead."""
        with self._lock:
            self._fallbacks[reason] += 1
        if self._prom is not None:
            self._prom.fallbacks.labels(self._engine, reason.value).inc()

    def drain_latencies(self) -> list[float]:
        """Latencies of the calls since the last drain (keep_latencies only)."""
        with self._lock:
            if self._recent is None:
                return []
            recent, self._recent = self._recent, []
            return recent

    def drain_waits(self) -> list[float]:
        """Waits since the last drain (keep_latencies only)."""
        with self._lock:
            if self._recent_waits is None:
                return []
            recent, self._recent_waits = self._recent_waits, []
            return recent

    def snapshot(self) -> CountersSnapshot:
        with self._lock:
            return CountersSnapshot(
                self._calls, self._ok, dict(self._fallbacks), self._latency, self._wait
            )


def _add(summary: LatencySummary, seconds: float) -> LatencySummary:
    return LatencySummary(summary.count + 1, summary.total_s + seconds, max(summary.max_s, seconds))


def _prometheus(registry: CollectorRegistry) -> _Prometheus:
    return _Prometheus(
        calls=Counter(
            "planner_adapter_calls",
            "Planner calls made by an engine adapter.",
            ["engine"],
            registry=registry,
        ),
        ok=Counter(
            "planner_adapter_answers",
            "Planner calls answered in time with a plan.",
            ["engine"],
            registry=registry,
        ),
        fallbacks=Counter(
            "planner_adapter_fallbacks",
            "Engine steps that fell back to the engine's own policy, by reason.",
            ["engine", "reason"],
            registry=registry,
        ),
        latency=Histogram(
            "planner_adapter_call_duration_seconds",
            "Time of one planner call as the adapter saw it.",
            ["engine"],
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        ),
        wait=Histogram(
            "planner_adapter_step_wait_seconds",
            "Time an engine step waited for a planner answer.",
            ["engine"],
            buckets=WAIT_BUCKETS_S,
            registry=registry,
        ),
    )
