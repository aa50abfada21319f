"""Fixtures of every engine adapter test: planner servers on loopback, a
real one and a stuck one, and an address nothing listens on."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from planner.rpc import RPCS
from planner.service.server import PlannerServer, ServerConfig


@pytest.fixture(scope="module")
def planner_server() -> Iterator[PlannerServer]:
    s = PlannerServer(ServerConfig(host="127.0.0.1", port=0))
    s.start()
    yield s
    s.stop(grace_s=1.0)


@pytest.fixture
def stuck_server() -> Iterator[str]:
    """A gRPC server whose PlanRotation handler blocks until the test ends:
    every call must run into its deadline."""
    release = threading.Event()
    rpc = RPCS["RotationService.PlanRotation"]

    def block(request: object, context: grpc.ServicerContext) -> object:
        release.wait()
        context.abort(grpc.StatusCode.CANCELLED, "released")

    handler = grpc.method_handlers_generic_handler(
        rpc.full_service,
        {
            rpc.name: grpc.unary_unary_rpc_method_handler(
                block,
                request_deserializer=rpc.request_type.FromString,
                response_serializer=lambda m: m.SerializeToString(),
            )
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers([handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    release.set()
    server.stop(grace=None).wait()


@pytest.fixture
def dead_target() -> str:
    """host:port of a port that was free a moment ago: nothing answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"
