"""Prometheus metrics of one server, under the names and labels every gRPC
dashboard knows (go-grpc-prometheus's): calls started, calls handled by
status code, and handling time; and the planner's own: how long a call
waited between the server taking it up and a worker thread starting it."""

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
        self.queue = Histogram(
            "planner_rpc_queue_seconds",
            "From the server's polling thread taking an RPC up to a worker thread "
            "starting its handler with the request message (the thread pool's hand-over "
            "and the message's delivery).",
            _LABELS,
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "planner_rpc_in_flight", "RPCs being answered now.", registry=self.registry
        )

    def start(self, rpc: Rpc, queued_s: float) -> None:
        """An RPC's handler starts, queued_s after the server took it up."""
        labels = (GRPC_TYPE, rpc.full_service, rpc.name)
        self.started.labels(*labels).inc()
        self.queue.labels(*labels).observe(queued_s)
        self.in_flight.inc()

    def observe(self, rpc: Rpc, code: str, seconds: float) -> None:
        self.in_flight.dec()
        labels = (GRPC_TYPE, rpc.full_service, rpc.name, code)
        self.latency.labels(*labels).observe(seconds)
        self.handled.labels(*labels).inc()
