"""64 concurrent engines against one real server on loopback: at a bounded
number of calls every one is answered; past the server's concurrency limit
calls are refused with RESOURCE_EXHAUSTED (back-pressure), none hangs past
its deadline, and the server answers a valid call afterwards.

gRPC frees a concurrency slot only after the handler has returned, which is
after its response went out: an engine that calls again at once can find
its previous call still counted. So 64 engines without retries need a limit
above 64 (the default is 128); at a limit of exactly 64 the client's retry
policy (which retries RESOURCE_EXHAUSTED) absorbs those refusals."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from planner.bench import synthetic
from planner.bench.proto_request import plan_rotation_request
from planner.client import PlannerClient
from planner.rpc import RPCS
from planner.service.limits import ServiceLimits
from planner.service.server import PlannerServer
from planner.v1 import rotation_pb2

CLIENTS = 64
CALLS_PER_CLIENT = 20
DEADLINE_S = 30.0
StartServer = Callable[..., PlannerServer]
PATH = RPCS["RotationService.PlanRotation"].full_path


@pytest.fixture(scope="module")
def request_bytes() -> bytes:
    """A 100-request contended snapshot, as the bench sends it."""
    return plan_rotation_request(synthetic.generate(100, seed=0), "columns").SerializeToString()


def _engine(address: str, request: bytes, calls: int, start: threading.Barrier) -> list[str]:
    """One engine: its own channel, `calls` PlanRotation calls after every
    engine is connected; the status code name of each."""
    codes = []
    with grpc.insecure_channel(address, options=[("grpc.enable_retries", 0)]) as channel:
        grpc.channel_ready_future(channel).result(timeout=DEADLINE_S)
        call = channel.unary_unary(
            PATH,
            request_serializer=lambda b: b,
            response_deserializer=rotation_pb2.PlanRotationResponse.FromString,
        )
        start.wait(timeout=DEADLINE_S)
        for _ in range(calls):
            try:
                response = call(request, timeout=DEADLINE_S)
                codes.append("OK" if response.HasField("plan") else "EMPTY")
            except grpc.RpcError as exc:
                codes.append(exc.code().name)
    return codes


def _drive(address: str, request: bytes, calls: int) -> Counter[str]:
    start = threading.Barrier(CLIENTS)
    with ThreadPoolExecutor(CLIENTS) as pool:
        futures = [pool.submit(_engine, address, request, calls, start) for _ in range(CLIENTS)]
        return Counter(code for f in futures for code in f.result(timeout=3 * DEADLINE_S))


def test_64_engines_without_retries_get_every_call_answered_at_default_limits(
    start_server: StartServer, request_bytes: bytes
) -> None:
    server = start_server()
    assert server.config.limits.max_concurrent_rpcs >= 2 * CLIENTS
    codes = _drive(server.address, request_bytes, CALLS_PER_CLIENT)
    assert codes == Counter({"OK": CLIENTS * CALLS_PER_CLIENT})


def _retrying_engine(
    address: str, request: rotation_pb2.PlanRotationRequest, start: threading.Barrier
) -> int:
    """An engine on PlannerClient with its default retry policy; OK calls."""
    with PlannerClient(address, deadline_s=DEADLINE_S) as client:
        client.info()
        start.wait(timeout=DEADLINE_S)
        return sum(client.plan_rotation(request).HasField("plan") for _ in range(CALLS_PER_CLIENT))


def test_64_engines_with_the_client_retry_policy_at_a_limit_of_64(
    start_server: StartServer, request_bytes: bytes
) -> None:
    server = start_server(limits=ServiceLimits(max_concurrent_rpcs=CLIENTS))
    request = rotation_pb2.PlanRotationRequest.FromString(request_bytes)
    start = threading.Barrier(CLIENTS)
    with ThreadPoolExecutor(CLIENTS) as pool:
        futures = [
            pool.submit(_retrying_engine, server.address, request, start) for _ in range(CLIENTS)
        ]
        answered = [f.result(timeout=3 * DEADLINE_S) for f in futures]
    assert answered == [CALLS_PER_CLIENT] * CLIENTS


def test_overload_is_refused_fast_not_queued_forever(
    start_server: StartServer, request_bytes: bytes
) -> None:
    server = start_server(limits=ServiceLimits(max_workers=1, max_concurrent_rpcs=2))
    codes = _drive(server.address, request_bytes, calls=5)
    assert sum(codes.values()) == CLIENTS * 5
    # DEADLINE_EXCEEDED would mean a call waited past its deadline.
    assert set(codes) == {"OK", "RESOURCE_EXHAUSTED"}
    with grpc.insecure_channel(server.address) as channel:
        call = channel.unary_unary(
            PATH,
            request_serializer=lambda b: b,
            response_deserializer=rotation_pb2.PlanRotationResponse.FromString,
        )
        assert call(request_bytes, timeout=DEADLINE_S).HasField("plan")
