"""Prometheus metrics of one server, under the names and labels every gRPC
dashboard knows (go-grpc-prometheus's): calls started, calls handled by
status code, and handling time."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from planner.rpc import Rpc

# Decision latencies live between tens of microseconds and a few seconds.
LATENCY_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0,
)  # fmt: skip
# Every planner RPC is unary.
GRPC_TYPE = "unary"
_LABELS = ["grpc_type", "grpc_service", "grpc_method"]


class RpcMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.started = Counter(
            "grpc_server_started",
            "RPCs started on the server.",
            _LABELS,
            registry=self.registry,
        )
        self.handled = Counter(
            "grpc_server_handled",
            "RPCs completed on the server, by status code.",
            [*_LABELS, "grpc_code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "grpc_server_handling_seconds",
            "Time to answer one RPC, by status code.",
            [*_LABELS, "grpc_code"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "planner_rpc_in_flight", "RPCs being answered now.", registry=self.registry
        )

    def start(self, rpc: Rpc) -> None:
        self.started.labels(GRPC_TYPE, rpc.full_service, rpc.name).inc()
        self.in_flight.inc()

    def observe(self, rpc: Rpc, code: str, seconds: float) -> None:
        self.in_flight.dec()
        labels = (GRPC_TYPE, rpc.full_service, rpc.name, code)
        self.latency.labels(*labels).observe(seconds)
        self.handled.labels(*labels).inc()
