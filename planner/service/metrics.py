"""Prometheus metrics of one server: per-RPC latency and outcomes."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Decision latencies live between tens of microseconds and a few seconds.
LATENCY_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0,
)  # fmt: skip


class RpcMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.latency = Histogram(
            "planner_rpc_duration_seconds",
            "Time to answer one RPC, by method and status code.",
            ["method", "code"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.calls = Counter(
            "planner_rpc_calls",
            "RPCs answered, by method and status code.",
            ["method", "code"],
            registry=self.registry,
        )
        self.errors = Counter(
            "planner_rpc_errors",
            "RPCs answered with a status other than OK, by method and code.",
            ["method", "code"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "planner_rpc_in_flight", "RPCs being answered now.", registry=self.registry
        )

    def observe(self, method: str, code: str, seconds: float) -> None:
        self.latency.labels(method, code).observe(seconds)
        self.calls.labels(method, code).inc()
        if code != "OK":
            self.errors.labels(method, code).inc()
