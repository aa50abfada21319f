"""Fixtures of the service tests: real PlannerServers on loopback, in process."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format

from planner.replay.policy_registries import served_policies
from planner.replay.role_oracle import ReplayRoleOracles
from planner.rpc import RPCS
from planner.service.limits import ServiceLimits
from planner.service.offload_engines import warm_up
from planner.service.server import PlannerServer, ServerConfig
from planner.v1 import rotation_pb2

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_REQUEST = REPO_ROOT / "fixtures" / "rotation" / "example_request.json"

StartServer = Callable[..., PlannerServer]


@pytest.fixture(scope="session", autouse=True)
def offload_search_loaded() -> None:
    """The compiled layer-offload search loaded before any server here takes
    a call. A server loads it in the background at start and an offload
    call that comes first waits for it; in a fresh checkout that is a
    compilation (minutes on a loaded 2-core machine), longer than the
    tests' deadlines, and a handler still compiling holds up the
    interpreter's exit."""
    warm_up()


@pytest.fixture
def start_server() -> Iterator[StartServer]:
    """Factory: start_server(limits=..., metrics_port=...) starts a PlannerServer
    on 127.0.0.1, port 0, and stops every one it started at teardown."""
    started: list[PlannerServer] = []

    def start(
        limits: ServiceLimits | None = None, metrics_port: int | None = None
    ) -> PlannerServer:
        server = PlannerServer(
            ServerConfig(
                host="127.0.0.1",
                port=0,
                metrics_port=metrics_port,
                limits=limits or ServiceLimits(),
            )
        )
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop(grace_s=1.0)


@pytest.fixture(scope="module")
def server() -> Iterator[PlannerServer]:
    """One planner server with default limits, shared by a test module."""
    s = PlannerServer(
        ServerConfig(
            host="127.0.0.1",
            port=0,
            role_oracles=ReplayRoleOracles(),
            policies=served_policies(),
        )
    )
    s.start()
    yield s
    s.stop(grace_s=1.0)


@pytest.fixture(scope="module")
def channel(server: PlannerServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.address) as ch:
        grpc.channel_ready_future(ch).result(timeout=10)
        yield ch


def load_example() -> rotation_pb2.PlanRotationRequest:
    return json_format.Parse(
        EXAMPLE_REQUEST.read_text(encoding="utf-8"), rotation_pb2.PlanRotationRequest()
    )


@pytest.fixture
def example_request() -> rotation_pb2.PlanRotationRequest:
    """fixtures/rotation/example_request.json, parsed (a fresh copy per test)."""
    return load_example()


def _identity(data: bytes) -> bytes:
    return data


def rpc_stub(
    channel: grpc.Channel, method: str, *, raw: bool = False
) -> grpc.UnaryUnaryMultiCallable:
    """A unary stub for Service.Method of planner.rpc. raw=True sends and
    returns bytes as they are on the wire."""
    rpc = RPCS[method]
    if raw:
        return channel.unary_unary(
            rpc.full_path, request_serializer=_identity, response_deserializer=_identity
        )
    return channel.unary_unary(
        rpc.full_path,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=rpc.response_type.FromString,
    )


@pytest.fixture
def stub() -> Callable[..., grpc.UnaryUnaryMultiCallable]:
    """stub(channel, "Service.Method", raw=False): see rpc_stub."""
    return rpc_stub


def to_columns(request: rotation_pb2.PlanRotationRequest) -> rotation_pb2.PlanRotationRequest:
    """The same request with its snapshot's rows sent as RequestColumns
    (absent timestamps NaN)."""
    out = rotation_pb2.PlanRotationRequest()
    out.CopyFrom(request)
    rows = list(request.snapshot.requests)
    del out.snapshot.requests[:]
    cols = out.snapshot.columns
    cols.SetInParent()
    for r in rows:
        cols.id.append(r.id)
        cols.state.append(r.state)
        for name in ("arrival_s", "run_start_s", "last_token_s", "first_token_s"):
            getattr(cols, name).append(getattr(r, name) if r.HasField(name) else math.nan)
        for name in (
            "prompt_blocks",
            "gpu_blocks",
            "cpu_blocks",
            "num_tokens",
            "synced_blocks",
            "slo_ttft_s",
            "slo_tbt_s",
            "prefill_tokens",
            "output_tokens",
        ):
            getattr(cols, name).append(getattr(r, name))
    return out


@pytest.fixture
def example_columns(example_request) -> rotation_pb2.PlanRotationRequest:
    """The example request with its requests as columns."""
    return to_columns(example_request)
