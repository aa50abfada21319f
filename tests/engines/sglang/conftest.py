"""A contended SGLang scheduler state built from the recorded structures.

Page size 16, 4 free pages. r-old has run for 50 s on 8 pages and made 28
tokens since its first at 51 s (46 s behind its 100 ms TPOT SLO: lost); r-new
started a second ago on 3 pages; w-late waited 4 s (past half its 5 s TTFT
SLO, not all of it) for a 64-token prompt (4 pages + 1 to decode); w-fresh
arrived 0.1 s ago (lag 0, so admitted after w-late). The planner
(Largest-VLT-First) admits both and preempts r-old; SGLang's own retraction
would take r-new first (fewest output tokens)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sglang_recorded import Req, ScheduleBatch, Scheduler, TimeStats, TokenAllocator

from planner.service.server import PlannerServer, ServerConfig


@pytest.fixture
def allocator() -> TokenAllocator:
    return TokenAllocator(free_tokens=64)


@pytest.fixture
def batch(allocator: TokenAllocator) -> ScheduleBatch:
    r_old = Req("r-old", list(range(100)), list(range(28)), TimeStats(40.0, 50.0, 99.9, 51.0))
    r_new = Req("r-new", list(range(40)), list(range(8)), TimeStats(98.0, 99.0, 99.9))
    return ScheduleBatch([r_old, r_new], allocator)


@pytest.fixture
def scheduler(allocator: TokenAllocator) -> Scheduler:
    w_fresh = Req("w-fresh", list(range(16)), time_stats=TimeStats(wait_queue_entry_time=99.9))
    w_late = Req("w-late", list(range(64)), time_stats=TimeStats(wait_queue_entry_time=96.0))
    return Scheduler([w_fresh, w_late], page_size=16, token_to_kv_pool_allocator=allocator)


@pytest.fixture(scope="module")
def planner_server() -> Iterator[PlannerServer]:
    server = PlannerServer(ServerConfig(host="127.0.0.1", port=0))
    server.start()
    yield server
    server.stop(grace_s=1.0)
