"""An iteration whose queue head cannot start (no free slot, or fewer free
blocks than it needs) does not ask a scheduler that only starts the queue
(Scheduler.starts_queue_only): the same moves as asking it. Two cores on
the same random workload, arrivals coming between iterations, one asking
every iteration and one skipping, agree after every iteration; a cluster
replay (every policy) gives the same results both ways."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.domain.requests import Slo
from planner.replay import batching_core as batching_core_module
from planner.replay.batching_core import BatchingCore, EngineConfig
from planner.replay.cluster_engine import ClusterEngine
from planner.replay.cluster_policies import CLUSTER_POLICY_NAMES
from planner.replay.scheduler_by_name import POLICY_NAMES, make_scheduler
from planner.replay.schedulers import Fcfs, FcfsVllm, Scheduler
from planner.replay.state import RequestColumns
from planner.trace.records import TraceRequest
from tests.replay.test_cluster_engine import tiny_config
from tests.replay.test_small_batch import (
    SETUP,
    SwappingFcfs,
    Workload,
    agree_both_ways,
    small_batch_core,
    snapshot,
    workloads,
)


@dataclasses.dataclass(frozen=True)
class Staggered:
    """A small-batch workload (its requests, pool, budget, chunk cap,
    swapping and pinned rows) whose requests come between iterations."""

    workload: Workload
    # Iteration before which each request arrives.
    arrives_before: list[int]
    max_running: int
    running_first: bool


@st.composite
def staggered(draw: st.DrawFn) -> Staggered:
    w = draw(workloads())
    n = len(w.prompts)
    return Staggered(
        workload=w,
        arrives_before=sorted(draw(st.lists(st.integers(0, 30), min_size=n, max_size=n))),
        max_running=draw(st.integers(1, 6)),
        running_first=draw(st.booleans()),
    )


def scheduler_of(case: Staggered) -> Scheduler:
    if case.workload.swaps:
        return SwappingFcfs()
    return FcfsVllm() if case.running_first else Fcfs()


def run_core(case: Staggered, skips: bool, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every iteration's batch and the state after it."""
    monkeypatch.setattr(batching_core_module, "SKIPS_BLOCKED_HEAD", skips)
    w = case.workload
    core = small_batch_core(w, scheduler_of(case), max_running=case.max_running)
    assert core._skips_blocked_head is skips
    s = core.state
    arrivals = np.array(case.arrives_before, dtype=np.int64)
    none = np.zeros(0, dtype=np.int64)
    seen: list[Any] = []
    for iteration in range(300):
        s.arrive((arrivals == iteration).nonzero()[0], none)
        if not s.active() and iteration > arrivals[-1]:
            break
        batch = core._iteration()
        seen.append(snapshot(core, batch))
    return seen


@settings(max_examples=150, deadline=None)
@given(case=staggered())
def test_skipping_a_blocked_head_makes_the_same_moves_as_asking(case: Staggered) -> None:
    agree_both_ways(lambda skips, monkeypatch: run_core(case, skips, monkeypatch))


def test_only_the_fcfs_policies_skip_asking() -> None:
    requests = RequestColumns.from_trace([], Slo())
    config = EngineConfig(gpu_kv_blocks=1, cpu_kv_blocks=0, block_bytes=1)
    for name in POLICY_NAMES:
        scheduler = make_scheduler(name, SETUP.rotation)
        core = BatchingCore(config, scheduler, SETUP.cost, SETUP.link, requests)
        assert core._skips_blocked_head is (name in ("fcfs", "fcfs-vllm")), name


@st.composite
def cluster_traces(draw: st.DrawFn) -> list[TraceRequest]:
    n = draw(st.integers(1, 30))
    gaps = draw(st.lists(st.floats(0.0, 0.05), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 100), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 30), min_size=n, max_size=n))
    arrivals = np.cumsum(gaps).tolist()
    return [
        TraceRequest(arrival_s=t, prompt_tokens=p, output_tokens=o, id=f"r{i}")
        for i, (t, p, o) in enumerate(zip(arrivals, prompts, outputs, strict=True))
    ]


@settings(max_examples=40, deadline=None)
@given(trace=cluster_traces(), policy=st.sampled_from(CLUSTER_POLICY_NAMES))
def test_cluster_results_are_the_same_with_and_without_skipping(
    trace: list[TraceRequest], policy: str
) -> None:
    runs = []
    with pytest.MonkeyPatch.context() as monkeypatch:
        for skips in (False, True):
            monkeypatch.setattr(batching_core_module, "SKIPS_BLOCKED_HEAD", skips)
            runs.append(ClusterEngine(tiny_config(), policy, SETUP.cost, trace).run())
    asking, skipping = runs
    assert skipping.result.requests == asking.result.requests
    assert skipping.result.timeline == asking.result.timeline
    assert dataclasses.replace(skipping.result.totals, wall_s=0.0) == dataclasses.replace(
        asking.result.totals, wall_s=0.0
    )
    assert skipping.stats == asking.stats
