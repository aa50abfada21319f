"""Shared cases of the common adapter tests: a small snapshot under memory
contention, and a gRPC server whose OffloadService never answers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from planner.adapters.common.snapshot import EngineRequestView, PoolSizes, ViewState

from planner.rpc import RPCS


@pytest.fixture
def pools() -> PoolSizes:
    return PoolSizes(free_gpu_blocks=4, block_size_tokens=16, free_cpu_blocks=1000)


@pytest.fixture
def views() -> list[EngineRequestView]:
    """r-old has run for 50 s on 8 blocks and made only 20 tokens since its
    first at 51 s: 47 s behind its 100 ms TPOT SLO, lost. w-late waited 4 s
    (past half its 5 s TTFT SLO, not past all of it) for a 64-token prompt (4
    blocks + 1 to decode) while only 4 blocks are free: LVF admits w-late and
    preempts r-old."""
    return [
        EngineRequestView(
            "r-old", ViewState.RUNNING, 100, 120, 20, 8, 0, arrival_s=40.0, run_start_s=50.0,
            last_token_s=99.9, first_token_s=51.0,
        ),
        EngineRequestView("w-late", ViewState.WAITING, 64, 0, 0, 0, 0, arrival_s=96.0),
    ]  # fmt: skip


@pytest.fixture
def stuck_offload_server() -> Iterator[str]:
    """host:port of a gRPC server whose OffloadService handlers block until
    the test ends: every call runs into its deadline."""
    release = threading.Event()

    def block(request: object, context: grpc.ServicerContext) -> object:
        release.wait()
        context.abort(grpc.StatusCode.CANCELLED, "released")

    rpcs = [RPCS[f"OffloadService.{name}"] for name in ("PlanLayerOffload", "ReportStep")]
    handler = grpc.method_handlers_generic_handler(
        rpcs[0].full_service,
        {
            rpc.name: grpc.unary_unary_rpc_method_handler(
                block,
                request_deserializer=rpc.request_type.FromString,
                response_serializer=lambda m: m.SerializeToString(),
            )
            for rpc in rpcs
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers([handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    release.set()
    server.stop(grace=None).wait()
