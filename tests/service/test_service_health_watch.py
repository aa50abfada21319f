"""grpc.health.v1.Health under Watch streams that open and close at once.

Against a real `planner serve`: eight threads keep re-opening Watch with
deadlines of 5 to 200 ms for a few seconds while 16 long Watch streams stay
open. The server must keep answering Check and planner RPCs throughout and
afterwards, and SIGTERM must stop it within its grace period, after every
open Watch stream got NOT_SERVING and its end. In process: a watcher sees
the current status after concurrent changes; the watcher cap; Check of an
unknown service."""

from __future__ import annotations

import itertools
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from planner.bench.server_process import ServerProcess
from planner.service.limits import ServiceLimits
from planner.service.server import SHUTDOWN_GRACE_S, PlannerServer, ServerConfig
from planner.v1 import info_pb2, info_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
CHURN_THREADS = 8
CHURN_S = 3.0
LONG_WATCHERS = 16
CALL_TIMEOUT_S = 10.0


@pytest.fixture
def server_process() -> Iterator[ServerProcess]:
    with ServerProcess("--store", ":memory:", "--log-level", "error") as process:
        yield process


def _churn(address: str, until: float, opened: list[int]) -> None:
    deadlines = (0.005, 0.02, 0.05, 0.2)
    n = 0
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < until:
            try:
                for _ in stub.Watch(
                    health_pb2.HealthCheckRequest(), timeout=deadlines[n % len(deadlines)]
                ):
                    pass
            except grpc.RpcError:
                pass
            n += 1
    opened.append(n)


def _long_watch(channel: grpc.Channel, seen: list[int], ended: list[str]) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        for response in stub.Watch(health_pb2.HealthCheckRequest(), timeout=60):
            seen.append(response.status)
        ended.append("OK")
    except grpc.RpcError as exc:
        ended.append(exc.code().name)


def test_watch_churn_keeps_the_server_answering_and_sigterm_stops_it(
    server_process: ServerProcess,
) -> None:
    address = server_process.address
    channel = grpc.insecure_channel(address)
    health = health_pb2_grpc.HealthStub(channel)
    info = info_pb2_grpc.PlannerInfoServiceStub(channel)
    seen: list[list[int]] = [[] for _ in range(LONG_WATCHERS)]
    ended: list[list[str]] = [[] for _ in range(LONG_WATCHERS)]
    watchers = [
        threading.Thread(target=_long_watch, args=(channel, seen[i], ended[i]))
        for i in range(LONG_WATCHERS)
    ]
    for t in watchers:
        t.start()
    until = time.monotonic() + CHURN_S
    opened: list[int] = []
    churners = [
        threading.Thread(target=_churn, args=(address, until, opened)) for _ in range(CHURN_THREADS)
    ]
    for t in churners:
        t.start()
    answered_during = 0
    while time.monotonic() < until:
        check = health.Check(health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT_S)
        assert check.status == SERVING
        answered_during += 1
    for t in churners:
        t.join()
    assert sum(opened) > 100, f"only {sum(opened)} Watch streams were opened"
    assert answered_during > 0
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT_S).status == SERVING
    answer = info.GetPlannerInfo(info_pb2.GetPlannerInfoRequest(), timeout=CALL_TIMEOUT_S)
    assert answer.version

    proc: subprocess.Popen[bytes] = server_process._proc
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=SHUTDOWN_GRACE_S + 5)
    except subprocess.TimeoutExpired:
        pytest.fail(f"planner serve did not stop within {SHUTDOWN_GRACE_S + 5} s of SIGTERM")
    took = time.monotonic() - started
    assert proc.returncode == 0
    assert took < SHUTDOWN_GRACE_S, f"stopped after {took:.1f} s"
    for t in watchers:
        t.join(timeout=10)
    channel.close()
    for i in range(LONG_WATCHERS):
        assert seen[i][0] == SERVING
        assert seen[i][-1] == NOT_SERVING, seen[i]
        assert ended[i] == ["OK"], ended[i]


def test_a_watcher_ends_on_the_current_status_after_concurrent_changes() -> None:
    server = PlannerServer(ServerConfig(host="127.0.0.1", port=0))
    server.start()
    name = "planner.v1.PlacementService"
    last = health_pb2.HealthCheckResponse.UNKNOWN
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            stream = stub.Watch(health_pb2.HealthCheckRequest(service=name), timeout=30)
            assert next(stream).status == SERVING

            def flip(k: int) -> None:
                for i in range(300):
                    server.health.set(name, NOT_SERVING if (i + k) % 2 else SERVING)

            flippers = [threading.Thread(target=flip, args=(k,)) for k in range(4)]
            for t in flippers:
                t.start()
            for t in flippers:
                t.join()
            server.health.set(name, last)
            # The stream converges on the current status: it must arrive
            # (a sender still draining the flips reads it when it sends).
            statuses: list[int] = []
            for response in stream:
                statuses.append(response.status)
                if response.status == last:
                    break
            # The shutdown sends NOT_SERVING and ends the stream.
            server.stop(grace_s=1.0)
            after_stop = [response.status for response in stream]
    finally:
        server.stop(grace_s=1.0)
    assert statuses[-1:] == [last], statuses[-5:]
    assert after_stop == [NOT_SERVING], after_stop
    everything = [SERVING, *statuses, *after_stop]
    assert all(a != b for a, b in itertools.pairwise(everything)), everything


def test_watch_streams_beyond_the_cap_are_refused_and_check_stays_open() -> None:
    server = PlannerServer(
        ServerConfig(host="127.0.0.1", port=0, limits=ServiceLimits(max_health_watchers=3))
    )
    server.start()
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            streams = [stub.Watch(health_pb2.HealthCheckRequest(), timeout=30) for _ in range(3)]
            for s in streams:
                assert next(s).status == SERVING
            with pytest.raises(grpc.RpcError) as refused:
                next(stub.Watch(health_pb2.HealthCheckRequest(), timeout=30))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status == SERVING
            with pytest.raises(grpc.RpcError) as unknown:
                stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
            streams[0].cancel()
            deadline = time.monotonic() + 10
            while server.health.watchers() > 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert next(stub.Watch(health_pb2.HealthCheckRequest(), timeout=30)).status == SERVING
    finally:
        server.stop(grace_s=1.0)
