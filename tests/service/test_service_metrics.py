"""Prometheus metrics over HTTP: calls started and handled and handling time,
with the standard gRPC labels (grpc_type, grpc_service, grpc_method,
grpc_code)."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from planner.service.server import PlannerServer, ServerConfig
from planner.v1 import info_pb2

PLAN = "RotationService.PlanRotation"
INFO = "PlannerInfoService.GetPlannerInfo"


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample at /metrics, keyed by (sample name, labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def labels(method: str, code: str | None = None, **extra: str) -> frozenset[tuple[str, str]]:
    """The standard gRPC labels of "Service.Method" (and a status code)."""
    service, name = method.split(".")
    grpc = {"grpc_type": "unary", "grpc_service": f"planner.v1.{service}", "grpc_method": name}
    if code is not None:
        grpc["grpc_code"] = code
    return frozenset({**grpc, **extra}.items())


def test_metrics_count_calls_by_method_and_code(start_server, stub, example_request):
    server = start_server(metrics_port=0)
    assert server.metrics_port not in (None, 0)
    before = scrape(server.metrics_port)
    assert not any(name.startswith("grpc_server_handling") for name, _ in before)

    bad = type(example_request)()
    bad.CopyFrom(example_request)
    bad.snapshot.free_gpu_blocks = -1
    with grpc.insecure_channel(server.address) as ch:
        plan = stub(ch, PLAN)
        for _ in range(3):
            plan(example_request, timeout=10)
        for _ in range(2):
            with pytest.raises(grpc.RpcError) as err:
                plan(bad, timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        stub(ch, INFO)(info_pb2.GetPlannerInfoRequest(), timeout=10)

    m = scrape(server.metrics_port)
    count = "grpc_server_handling_seconds_count"
    assert m[count, labels(PLAN, "OK")] == 3
    assert m[count, labels(PLAN, "INVALID_ARGUMENT")] == 2
    assert m[count, labels(INFO, "OK")] == 1
    # Every call lands in the +Inf bucket; durations are positive.
    assert m["grpc_server_handling_seconds_bucket", labels(PLAN, "OK", le="+Inf")] == 3
    assert m["grpc_server_handling_seconds_sum", labels(PLAN, "OK")] > 0
    assert m["grpc_server_started_total", labels(PLAN)] == 5
    assert m["grpc_server_started_total", labels(INFO)] == 1
    assert m["grpc_server_handled_total", labels(PLAN, "OK")] == 3
    assert m["grpc_server_handled_total", labels(PLAN, "INVALID_ARGUMENT")] == 2
    assert ("grpc_server_handled_total", labels(INFO, "INVALID_ARGUMENT")) not in m
    assert m["planner_rpc_in_flight", frozenset()] == 0


def test_metrics_of_two_servers_are_separate(start_server, stub, example_request):
    a = start_server(metrics_port=0)
    b = start_server(metrics_port=0)
    with grpc.insecure_channel(a.address) as ch:
        stub(ch, PLAN)(example_request, timeout=10)
    count = ("grpc_server_handling_seconds_count", labels(PLAN, "OK"))
    assert scrape(a.metrics_port)[count] == 1
    assert count not in scrape(b.metrics_port)


def test_metrics_endpoint_closes_with_the_server(start_server):
    server = start_server(metrics_port=0)
    port = server.metrics_port
    assert scrape(port)
    server.stop(grace_s=1.0)
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)


def test_no_metrics_port_by_default(server):
    assert server.metrics_port is None


def test_metrics_port_in_use_fails_start_and_leaves_nothing_serving():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = PlannerServer(ServerConfig(host="127.0.0.1", port=0, metrics_port=port))
        with pytest.raises(OSError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            server.start()
    with grpc.insecure_channel(server.address) as ch, pytest.raises(grpc.RpcError) as err:
        health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    server.stop()  # a no-op now, and harmless


@pytest.mark.parametrize(("metrics_host", "bound"), [(None, "127.0.0.1"), ("0.0.0.0", "0.0.0.0")])
def test_metrics_bind_loopback_unless_asked_even_when_grpc_listens_everywhere(metrics_host, bound):
    """/metrics has no token: a server listening on every address keeps it on
    loopback by default."""
    extra = {} if metrics_host is None else {"metrics_host": metrics_host}
    server = PlannerServer(ServerConfig(host="0.0.0.0", port=0, metrics_port=0, **extra))
    server.start()
    try:
        assert server._metrics_http.server_address[0] == bound
        assert scrape(server.metrics_port)
    finally:
        server.stop(grace_s=0)
