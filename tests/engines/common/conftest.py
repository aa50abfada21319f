"""Shared cases of the common adapter tests: a small snapshot under memory
contention."""

from __future__ import annotations

import pytest
from planner.adapters.common.snapshot import EngineRequestView, PoolSizes, ViewState


@pytest.fixture
def pools() -> PoolSizes:
    return PoolSizes(free_gpu_blocks=4, block_size_tokens=16, free_cpu_blocks=1000)


@pytest.fixture
def views() -> list[EngineRequestView]:
    """r-old has run for 50 s on 8 blocks; w-late waited 10 s (past half its
    5 s TTFT SLO) for a 64-token prompt (4 blocks + 1 to decode) while only 4
    blocks are free: LVF admits w-late and preempts r-old."""
    return [
        EngineRequestView(
            "r-old", ViewState.RUNNING, 100, 120, 20, 8, 0, arrival_s=40.0, run_start_s=50.0,
            last_token_s=99.9,
        ),
        EngineRequestView("w-late", ViewState.WAITING, 64, 0, 0, 0, 0, arrival_s=90.0),
    ]  # fmt: skip
