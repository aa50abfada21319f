"""Forming a batch and emitting its tokens request by request (below
planner.replay.batch.SMALL_BATCH and engine_state.SMALL_EMIT running rows)
gives the same batches and the same state as on whole columns: two cores on
the same random workload, one each way, agree after every iteration, with
tight KV (preemptions by recompute or swap, pinned rows), chunked prefill
and a token budget that cuts the decodes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.domain.requests import Slo
from planner.replay import batch as batch_module
from planner.replay import engine_state as engine_state_module
from planner.replay.batch import Batch
from planner.replay.batching_core import BatchingCore, EngineConfig
from planner.replay.schedulers import Fcfs, Scheduler
from planner.replay.setup import DEFAULT_PROFILE, ReplayKnobs, build_setup
from planner.replay.state import RequestColumns
from planner.trace.records import TraceRequest

# The default profile's cost model and link.
SETUP = build_setup(DEFAULT_PROFILE, ReplayKnobs())


class SwappingFcfs(Fcfs):
    """fcfs whose preemptions for a block swap (its KV goes to CPU blocks)."""

    swaps = True


@dataclasses.dataclass(frozen=True)
class Workload:
    prompts: list[int]
    outputs: list[int]
    gpu_blocks: int
    block_size: int
    budget: int
    max_chunk: int | None
    swaps: bool
    pinned: list[int]


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
        gpu_blocks=draw(st.integers(largest, largest * 3)),
        block_size=block_size,
        budget=draw(st.integers(1, 300)),
        max_chunk=draw(st.one_of(st.none(), st.integers(1, 64))),
        swaps=draw(st.booleans()),
        pinned=draw(st.lists(st.integers(0, n - 1), max_size=2, unique=True)),
    )


def small_batch_core(w: Workload, scheduler: Scheduler, max_running: int = 256) -> BatchingCore:
    """A core for the workload (nothing arrived yet), its pinned rows set."""
    trace = [
        TraceRequest(arrival_s=0.0, prompt_tokens=p, output_tokens=o, id=f"r{i}")
        for i, (p, o) in enumerate(zip(w.prompts, w.outputs, strict=True))
    ]
    requests = RequestColumns.from_trace(trace, Slo())
    config = EngineConfig(
        gpu_kv_blocks=w.gpu_blocks,
        cpu_kv_blocks=10**6 if w.swaps else 0,
        block_bytes=1,
        block_size_tokens=w.block_size,
        max_batched_tokens=w.budget,
        max_running=max_running,
        max_chunk_tokens=w.max_chunk,
        skips_empty_iterations=True,
        records_timeline=False,
    )
    core = BatchingCore(config, scheduler, SETUP.cost, SETUP.link, requests, pairs_cost=SETUP.cost)
    core.state.pinned = set(w.pinned)
    return core


def run_core(w: Workload, small: bool, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every iteration's batch and the state after it."""
    monkeypatch.setattr(batch_module, "SMALL_BATCH", 10**9 if small else 0)
    monkeypatch.setattr(engine_state_module, "SMALL_EMIT", 10**9 if small else 0)
    return iterations_of(small_batch_core(w, SwappingFcfs() if w.swaps else Fcfs()), len(w.prompts))


def iterations_of(core: BatchingCore, requests: int) -> list[Any]:
    """Every iteration's snapshot, the core's first ``requests`` rows
    arrived at once, until nothing is active or an iteration does nothing."""
    s = core.state
    s.arrive(np.arange(requests, dtype=np.int64), np.zeros(0, dtype=np.int64))
    seen: list[Any] = []
    for _ in range(400):
        if not s.active():
            break
        batch = core._iteration()
        seen.append(snapshot(core, batch))
        if not (batch.prefill_tokens or batch.decode_tokens) and not len(s.rotary.rows):
            break
    return seen


def snapshot(core: BatchingCore, batch: Batch) -> Any:
    s = core.state
    r = core.requests
    # NaN (an absent time) as None, so that equal columns compare equal.
    columns = {
        f.name: [None if x != x else x for x in getattr(r, f.name).tolist()]
        for f in dataclasses.fields(r)
        if isinstance(getattr(r, f.name), np.ndarray) and f.name != "id_array"
    }
    return (
        tuple(int(x) if not isinstance(x, np.ndarray) else x.tolist() for x in batch),
        columns,
        [q.rows.tolist() for q in (s.queued, s.running, s.rotary, s.in_transit)],
        (s.free_gpu, s.free_cpu, s.preemptions, s.swap_outs, s.finished),
        s.tokens.recorded().tolist(),
        core.now_s,
    )


@settings(max_examples=150, deadline=None)
@given(w=workloads())
def test_small_batches_form_and_emit_as_on_whole_columns(w: Workload) -> None:
    agree_both_ways(lambda small, monkeypatch: run_core(w, small, monkeypatch))


def agree_both_ways(run: Callable[[bool, pytest.MonkeyPatch], list[Any]]) -> None:
    """run(False, ...) and run(True, ...) (a fast path off, then on) give
    the same snapshots, iteration by iteration."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        one_way = run(False, monkeypatch)
        other_way = run(True, monkeypatch)
    assert len(one_way) == len(other_way)
    for i, (a, b) in enumerate(zip(one_way, other_way, strict=True)):
        assert a == b, f"iteration {i} differs"
