"""Deadlines and the client's bounded retries."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from held_call import held_call

from planner.client import PlannerClient, PlannerError, RetryPolicy
from planner.service.limits import ServiceLimits
from planner.service.server import PlannerServer
from planner.v1 import info_pb2

PLAN = "RotationService.PlanRotation"


def assert_still_serving(channel: grpc.Channel, stub, request) -> None:
    response = stub(channel, PLAN)(request, timeout=10)
    assert [d.id for d in response.plan.prioritized] == ["a", "c"]
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert health.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("timeout", [-1.0, -0.1])
def test_expired_deadline_is_deadline_exceeded(channel, stub, example_request, timeout):
    with pytest.raises(grpc.RpcError) as err:
        stub(channel, PLAN)(example_request, timeout=timeout)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert_still_serving(channel, stub, example_request)


@pytest.fixture
def busy_server(start_server) -> Iterator[tuple[PlannerServer, threading.Event]]:
    """A server whose only worker is held by a reflection stream until the
    event is set: no call can be answered before then."""
    server = start_server(ServiceLimits(max_workers=1))
    with held_call(server.address) as (_, release):
        yield server, release


# gRPC rounds deadlines to whole milliseconds, so on an idle loopback server
# a deadline of 0 or 1 us may still be met; on a busy one it cannot be.
@pytest.mark.parametrize("timeout", [0.0, 1e-6, 0.05])
def test_tiny_deadline_on_a_busy_server_is_deadline_exceeded(
    busy_server, stub, example_request, timeout
):
    server, release = busy_server
    with grpc.insecure_channel(server.address) as ch:
        with pytest.raises(grpc.RpcError) as err:
            stub(ch, PLAN)(example_request, timeout=timeout)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        release.set()
        # Once the worker is free the server answers as before.
        assert_still_serving(ch, stub, example_request)


def test_client_deadline_exceeded_is_a_planner_error(busy_server, example_request):
    server, release = busy_server
    with (
        PlannerClient(server.address, deadline_s=10) as client,
        pytest.raises(PlannerError) as err,
    ):
        client.plan_rotation(example_request, deadline_s=0.01)
        assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert str(err.value).startswith("DEADLINE_EXCEEDED: ")
        release.set()
        # The same client (and channel) keeps working.
        assert [d.id for d in client.plan_rotation(example_request).plan.prioritized] == ["a", "c"]


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A loopback port bound by nobody's listener: connections are refused.
    The socket stays bound (not listening) so no one else takes the port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def test_client_against_a_dead_port_is_unavailable(dead_port, example_request):
    # A generous deadline: the client gives up after its bounded attempts
    # with UNAVAILABLE, it does not wait out the deadline (that would read
    # DEADLINE_EXCEEDED).
    with (
        PlannerClient(f"127.0.0.1:{dead_port}", deadline_s=30) as client,
        pytest.raises(PlannerError) as err,
    ):
        client.plan_rotation(example_request)
    assert err.value.code == grpc.StatusCode.UNAVAILABLE


class FlakyServer:
    """A bare gRPC server whose GetPlannerInfo fails with `codes` in turn
    (then answers OK), counting the attempts it sees."""

    def __init__(self, codes: list[grpc.StatusCode]) -> None:
        self.codes = list(codes)
        self.attempts = 0
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handler = grpc.unary_unary_rpc_method_handler(
            self._answer,
            request_deserializer=info_pb2.GetPlannerInfoRequest.FromString,
            response_serializer=lambda m: m.SerializeToString(),
        )
        self._server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    "planner.v1.PlannerInfoService", {"GetPlannerInfo": handler}
                )
            ]
        )
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    def _answer(self, request, context):
        with self._lock:
            self.attempts += 1
            code = self.codes.pop(0) if self.codes else None
        if code is not None:
            context.abort(code, f"attempt {self.attempts} fails")
        return info_pb2.GetPlannerInfoResponse(version="flaky")

    def stop(self) -> None:
        self._server.stop(None).wait()


@pytest.fixture
def flaky() -> Iterator[type[FlakyServer]]:
    servers: list[FlakyServer] = []

    def make(codes: list[grpc.StatusCode]) -> FlakyServer:
        s = FlakyServer(codes)
        servers.append(s)
        return s

    yield make  # type: ignore[misc]
    for s in servers:
        s.stop()


UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def test_client_retries_unavailable_at_most_max_attempts(flaky):
    server = flaky([UNAVAILABLE] * 10)
    with (
        PlannerClient(f"127.0.0.1:{server.port}", deadline_s=30) as client,
        pytest.raises(PlannerError) as err,
    ):
        client.info()
    assert err.value.code == UNAVAILABLE
    assert server.attempts == RetryPolicy().max_attempts == 3


def test_client_recovers_when_a_retry_succeeds(flaky):
    server = flaky([UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED])
    with PlannerClient(f"127.0.0.1:{server.port}", deadline_s=30) as client:
        assert client.info().version == "flaky"
    assert server.attempts == 3


@pytest.mark.parametrize(
    "code",
    [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL, grpc.StatusCode.NOT_FOUND],
)
def test_client_does_not_retry_other_codes(flaky, code):
    server = flaky([code])
    with (
        PlannerClient(f"127.0.0.1:{server.port}", deadline_s=30) as client,
        pytest.raises(PlannerError) as err,
    ):
        client.info()
    assert err.value.code == code
    assert err.value.details == "attempt 1 fails"
    assert server.attempts == 1


def test_client_without_retries_makes_one_attempt(flaky):
    server = flaky([UNAVAILABLE])
    retry = RetryPolicy(max_attempts=1)
    with (
        PlannerClient(f"127.0.0.1:{server.port}", deadline_s=30, retry=retry) as client,
        pytest.raises(PlannerError),
    ):
        client.info()
    assert server.attempts == 1


def test_client_max_attempts_is_configurable(flaky):
    server = flaky([UNAVAILABLE] * 10)
    retry = RetryPolicy(max_attempts=5)
    with (
        PlannerClient(f"127.0.0.1:{server.port}", deadline_s=30, retry=retry) as client,
        pytest.raises(PlannerError),
    ):
        client.info()
    assert server.attempts == 5
