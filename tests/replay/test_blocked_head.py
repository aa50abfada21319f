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
from tests.replay.test_small_batch import SETUP, SwappingFcfs, snapshot

SCHEDULERS: dict[str, type[Scheduler]] = {
    "fcfs": Fcfs,
    "fcfs-vllm": FcfsVllm,
    "fcfs-swapping": SwappingFcfs,
}


@dataclasses.dataclass(frozen=True)
class Workload:
    prompts: list[int]
    outputs: list[int]
    # Iteration before which each request arrives.
    arrives_before: list[int]
    gpu_blocks: int
    block_size: int
    budget: int
    max_running: int
    scheduler: str


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    n = draw(st.integers(1, 14))
    block_size = draw(st.sampled_from([4, 16]))
    prompts = draw(st.lists(st.integers(1, 120), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    # Enough for the largest request alone (else it is rejected), not for all.
    largest = max(-(-(p + o) // block_size) + 1 for p, o in zip(prompts, outputs, strict=True))
    return Workload(
        prompts=prompts,
        outputs=outputs,
        arrives_before=sorted(draw(st.lists(st.integers(0, 30), min_size=n, max_size=n))),
        gpu_blocks=draw(st.integers(largest, largest * 3)),
        block_size=block_size,
        budget=draw(st.integers(1, 300)),
        max_running=draw(st.integers(1, 6)),
        scheduler=draw(st.sampled_from(sorted(SCHEDULERS))),
    )


def run_core(w: Workload, skips: bool, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every iteration's batch and the state after it."""
    monkeypatch.setattr(batching_core_module, "SKIPS_BLOCKED_HEAD", skips)
    trace = [
        TraceRequest(arrival_s=0.0, prompt_tokens=p, output_tokens=o, id=f"r{i}")
        for i, (p, o) in enumerate(zip(w.prompts, w.outputs, strict=True))
    ]
    requests = RequestColumns.from_trace(trace, Slo())
    config = EngineConfig(
        gpu_kv_blocks=w.gpu_blocks,
        cpu_kv_blocks=10**6,
        block_bytes=1,
        block_size_tokens=w.block_size,
        max_batched_tokens=w.budget,
        max_running=w.max_running,
        records_timeline=False,
    )
    core = BatchingCore(
        config, SCHEDULERS[w.scheduler](), SETUP.cost, SETUP.link, requests, pairs_cost=SETUP.cost
    )
    assert core._skips_blocked_head is skips
    s = core.state
    arrivals = np.array(w.arrives_before, dtype=np.int64)
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
@given(w=workloads())
def test_skipping_a_blocked_head_makes_the_same_moves_as_asking(w: Workload) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        asking = run_core(w, skips=False, monkeypatch=monkeypatch)
        skipping = run_core(w, skips=True, monkeypatch=monkeypatch)
    assert len(asking) == len(skipping)
    for i, (a, b) in enumerate(zip(asking, skipping, strict=True)):
        assert a == b, f"iteration {i} differs"


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
