"""A KV residency that names the rows that run (kv_residency.PicksRows)
gives the same batches and the same state as one that names the rows it
pauses: two cores on the same random workload, one each way, agree after
every iteration, with KV loose enough that the rows' batch is formed on
them alone (batch.form_batch_of) and tight enough that the core pauses the
rest instead (preemptions by recompute or swap)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from planner.replay.batch import Batch, form_batch_of
from planner.replay.batching_core import BatchingCore
from planner.replay.engine_state import EngineState
from planner.replay.kv_residency import PicksRows, ResidentIteration
from planner.replay.schedulers import Fcfs
from planner.replay.state import IntArray
from tests.replay.test_small_batch import (
    SwappingFcfs,
    Workload,
    agree_both_ways,
    iterations_of,
    small_batch_core,
    workloads,
)


class PausesEveryOther:
    """Runs the running rows at even positions in one iteration, those at
    odd positions in the next (in running's order); names those it pauses."""

    def __init__(self) -> None:
        self.iterations = 0

    def _chosen(self, state: EngineState) -> list[int]:
        rows: list[int] = state.running.rows.tolist()[self.iterations % 2 :: 2]
        self.iterations += 1
        return rows

    def paused(self, state: EngineState, now_s: float) -> IntArray:
        runs = set(self._chosen(state))
        return np.array([row for row in state.running.rows.tolist() if row not in runs])

    def timed(self, batch: Batch, compute_s: float) -> ResidentIteration:
        return ResidentIteration(compute_s, 0.0, 0, 0)

    def emitted(self, state: EngineState, batch: Batch, now_s: float) -> None:
        pass


class PicksEveryOther(PausesEveryOther):
    """The same, naming the rows that run."""

    def runs(self, state: EngineState, now_s: float) -> list[int]:
        return self._chosen(state)


def run_core(w: Workload, picks: bool) -> list[object]:
    """Every iteration's batch and the state after it."""
    core = small_batch_core(w, SwappingFcfs() if w.swaps else Fcfs())
    residency = PicksEveryOther() if picks else PausesEveryOther()
    assert isinstance(residency, PicksRows) == picks
    core = BatchingCore(
        core.config,
        core.scheduler,
        core.cost,
        core.link,
        core.requests,
        pairs_cost=core.pairs_cost,
        residency=residency,
    )
    core.state.pinned = set(w.pinned)
    return iterations_of(core, len(w.prompts))


@settings(max_examples=150, deadline=None)
@given(w=workloads())
def test_rows_named_to_run_batch_as_rows_named_to_pause(w: Workload) -> None:
    agree_both_ways(lambda picks, _monkeypatch: run_core(w, picks))


def test_the_rows_batch_needs_a_free_block_for_each() -> None:
    w = Workload([8, 8], [4, 4], 6, 4, 64, None, False, [])
    core = small_batch_core(w, Fcfs())
    s = core.state
    s.arrive(np.arange(2, dtype=np.int64), np.zeros(0, dtype=np.int64))
    s.free_gpu = 1
    with pytest.raises(ValueError, match="free blocks"):
        form_batch_of(s, [0, 1], 64, 0.0, None)
