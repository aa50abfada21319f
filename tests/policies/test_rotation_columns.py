"""The columnar entry point the replay engine uses (plan_rows with a
KeyRanking) decides exactly what plan_rotation (the service's, with ids
compared as strings) decides, on random consistent snapshots."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_rotation_properties import Case, counts_cases, rotation_inputs

from planner.domain.requests import RequestState
from planner.domain.rotation import RotationInputs
from planner.policies import rotation_columns as lvf
from planner.policies import rotation_decide
from planner.policies.rotation import plan_rotation

RUNNING = np.int8(RequestState.RUNNING)
SETTINGS = settings(max_examples=300, deadline=None)


def _pools(case: Case) -> lvf.Pools:
    s = case.snapshot()
    return lvf.Pools(
        now_s=s.now_s,
        free_gpu_blocks=s.free_gpu_blocks,
        free_cpu_blocks=s.free_cpu_blocks,
        cpu_room=s.free_cpu_blocks,
        last_iteration_s=s.last_iteration_s,
        block_size_tokens=s.block_size_tokens,
    )


@SETTINGS
@given(counts_cases(), rotation_inputs())
def test_plan_rows_names_what_plan_rotation_names(case: Case, inputs: RotationInputs) -> None:
    snapshot = case.snapshot()
    table = snapshot.requests
    plan = plan_rotation(snapshot, inputs)
    ranks = lvf.arrival_id_ranks(table.arrival_s, table.ids)
    for ranking in (lvf.TableRanking(table.arrival_s, table.ids), lvf.KeyRanking(ranks)):
        rows = rotation_decide.plan_rows(table, _pools(case), inputs, ranking)
        assert [table.ids[i] for i in rows.prioritized.tolist()] == [d.id for d in plan.prioritized]
        assert [table.ids[i] for i in rows.preempted.tolist()] == [d.id for d in plan.preempted]
        assert rows.eager_blocks == plan.explanation.eager_blocks


@SETTINGS
@given(counts_cases(), rotation_inputs(), st.randoms(use_true_random=False))
def test_key_ranking_orders_like_the_table(
    case: Case, inputs: RotationInputs, rnd: random.Random
) -> None:
    snapshot = case.snapshot()
    table = snapshot.requests
    vlt = lvf.virtual_lag_time(table, snapshot.now_s, inputs)
    candidates = vlt >= 0
    preemptable = [rnd.random() < 0.5 for _ in range(len(table))]
    mask = np.array(preemptable, dtype=np.bool_) & ~candidates
    key = lvf.KeyRanking(lvf.arrival_id_ranks(table.arrival_s, table.ids))
    by_table = lvf.TableRanking(table.arrival_s, table.ids)
    for a, b in zip(
        key.by_lag(vlt, candidates, mask), by_table.by_lag(vlt, candidates, mask), strict=True
    ):
        assert a.tolist() == b.tolist()
    rows = np.flatnonzero(table.state != RUNNING)
    assert key.by_arrival(rows).tolist() == by_table.by_arrival(rows).tolist()


@SETTINGS
@given(counts_cases(), rotation_inputs())
def test_grouped_rows_give_the_same_plan(case: Case, inputs: RotationInputs) -> None:
    # Requests listed WAITING, then RUNNING, then ROTARY (as the engine lists
    # them): the grouped shortcut decides what plan_rotation decides.
    order = sorted(range(len(case.requests)), key=lambda i: int(case.requests[i].state))
    snapshot = case.snapshot(order)
    table = snapshot.requests
    state = table.state.tolist()
    grouped = (
        state.count(int(RequestState.WAITING)),
        len(state) - state.count(int(RequestState.ROTARY)),
    )
    plan = plan_rotation(snapshot, inputs)
    ranks = lvf.arrival_id_ranks(table.arrival_s, table.ids)
    pools = lvf.Pools(
        now_s=snapshot.now_s,
        free_gpu_blocks=snapshot.free_gpu_blocks,
        free_cpu_blocks=snapshot.free_cpu_blocks,
        cpu_room=snapshot.free_cpu_blocks,
        last_iteration_s=snapshot.last_iteration_s,
        block_size_tokens=snapshot.block_size_tokens,
    )
    rows = rotation_decide.plan_rows(table, pools, inputs, lvf.KeyRanking(ranks), grouped)
    assert [table.ids[i] for i in rows.prioritized.tolist()] == [d.id for d in plan.prioritized]
    assert [table.ids[i] for i in rows.preempted.tolist()] == [d.id for d in plan.preempted]
    assert rows.eager_blocks == plan.explanation.eager_blocks
    d = rotation_decide.decide(table, pools, inputs, lvf.KeyRanking(ranks), grouped)
    if d.vlt is not None:
        assert d.vlt.tolist() == lvf.virtual_lag_time(table, snapshot.now_s, inputs).tolist()
        assert d.need is not None
        assert d.need.tolist() == lvf.blocks_needed(table).tolist()


def test_arrival_id_ranks_order_by_arrival_absent_last_then_id() -> None:
    arrival = np.array([2.0, np.nan, 1.0, 2.0, 1.0])
    ids = ["b", "a", "z", "a", "y"]
    ranks = lvf.arrival_id_ranks(arrival, ids)
    assert ranks.dtype == np.uint16
    assert np.argsort(ranks).tolist() == [4, 2, 3, 0, 1]
    # Beyond 16 bits: 64-bit ranks, the same order.
    n = (1 << 16) + 3
    rng = np.random.default_rng(0)
    arrival = rng.integers(0, 50, n).astype(np.float64)
    ids = [f"r{i}" for i in rng.permutation(n).tolist()]
    ranks = lvf.arrival_id_ranks(arrival, ids)
    assert ranks.dtype == np.int64
    expected = sorted(range(n), key=lambda i: (arrival[i], ids[i]))
    assert np.argsort(ranks).tolist() == expected
