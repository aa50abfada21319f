"""Snapshot building from engine-neutral views and plan application: exact
requests for small cases, and rejection of plans that cannot be applied."""

from __future__ import annotations

import math

import pytest
from planner.adapters.common.apply import (
    InvalidPlanError,
    accept_plan,
    plan_actions,
    recheck_plan,
)
from planner.adapters.common.counters import FallbackCounters, FallbackReason
from planner.adapters.common.snapshot import (
    EngineRequestView,
    PoolSizes,
    ViewState,
    build_rotation_request,
)

from planner.v1 import common_pb2, rotation_pb2


def test_snapshot_columns_carry_each_state(pools):
    views = [
        EngineRequestView("run", ViewState.RUNNING, 30, 40, 10, 3, 0, 1.0, run_start_s=2.0),
        EngineRequestView("wait", ViewState.WAITING, 33, 0, 0, 0, 0, 5.0),
        EngineRequestView(
            "pre", ViewState.PREEMPTED, 20, 0, 15, 0, 0, 3.0, run_start_s=4.0, last_token_s=6.0
        ),
        EngineRequestView(
            "swp", ViewState.SWAPPED, 20, 0, 5, 0, 2, 3.0, run_start_s=4.0, last_token_s=7.0
        ),
        # Preempted before its first token: waiting again.
        EngineRequestView("pre0", ViewState.PREEMPTED, 17, 0, 0, 0, 0, 8.0, run_start_s=9.0),
    ]
    snap = build_rotation_request(views, pools, 10.0, last_iteration_s=0.02).snapshot
    cols = snap.columns
    assert (snap.now_s, snap.free_gpu_blocks, snap.block_size_tokens) == (10.0, 4, 16)
    assert (snap.free_cpu_blocks, snap.last_iteration_s) == (1000, 0.02)
    assert list(cols.id) == ["run", "wait", "pre", "swp", "pre0"]
    run, wait, rotary = common_pb2.RUNNING, common_pb2.WAITING, common_pb2.ROTARY
    assert list(cols.state) == [run, wait, rotary, rotary, wait]
    assert list(cols.prompt_blocks) == [0, 3, 0, 0, 2]
    assert list(cols.gpu_blocks) == [3, 0, 0, 0, 0]
    # Recompute of 20 + 15 tokens and one more: 3 blocks; swapped: its 2.
    assert list(cols.cpu_blocks) == [0, 0, 3, 2, 0]
    assert list(cols.num_tokens) == [40, 0, 0, 0, 0]
    assert list(cols.last_token_s)[2:4] == [6.0, 7.0]
    assert math.isnan(cols.last_token_s[0])
    assert math.isnan(cols.run_start_s[1])


def _plan(prioritized=(), preempted=(), fcfs=False) -> rotation_pb2.RotationPlan:
    plan = rotation_pb2.RotationPlan(fcfs_fallback=fcfs)
    for rid in prioritized:
        plan.prioritized.add(id=rid)
    for rid in preempted:
        plan.preempted.add(id=rid)
    return plan


def test_actions_keep_the_plan_order(views, pools):
    actions = plan_actions(_plan(["w-late"], ["r-old"]), views, pools)
    assert (actions.fcfs, actions.resume, actions.preempt) == (False, ("w-late",), ("r-old",))
    assert actions.swap_out == actions.swap_in == actions.eager == ()


def test_block_moves_become_actions(views, pools):
    plan = _plan([], ["r-old"])
    plan.moves.add(
        id="r-old",
        kind=rotation_pb2.MOVE_KIND_SWAP_OUT,
        logical_index=[0, 1],
        src_block_ids=[7, 9],
        dst_block_ids=[0, 1],
    )
    (moves,) = plan_actions(plan, views, pools).swap_out
    assert (moves.request_id, moves.src_block_ids, moves.dst_block_ids) == ("r-old", (7, 9), (0, 1))


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (_plan(["ghost"]), "unknown request 'ghost'"),
        (_plan([], ["w-late"]), "is not running"),
        (_plan(["r-old"]), "already running"),
        (_plan(["w-late", "w-late"], ["r-old"]), "listed twice"),
        # w-late needs 5 blocks; 4 are free and nothing is preempted.
        (_plan(["w-late"]), "resumes 5 blocks, only 4 free"),
    ],
)
def test_invalid_plans_are_rejected(views, pools, plan, message):
    with pytest.raises(InvalidPlanError, match=message):
        plan_actions(plan, views, pools)


def test_both_resumed_and_preempted_is_rejected(pools):
    views = [
        EngineRequestView("a", ViewState.RUNNING, 16, 16, 1, 2, 0, 0.0, run_start_s=0.0),
    ]
    plan = _plan([], ["a"])
    plan.prioritized.add(id="a")
    with pytest.raises(InvalidPlanError, match="both resumed and preempted"):
        plan_actions(plan, views, pools)


def test_accept_plan_counts_invalid_plans(views, pools):
    counters = FallbackCounters()
    good = rotation_pb2.PlanRotationResponse(plan=_plan(["w-late"], ["r-old"]))
    bad = rotation_pb2.PlanRotationResponse(plan=_plan(["ghost"]))
    assert accept_plan(good, views, pools, counters) is not None
    assert accept_plan(bad, views, pools, counters) is None
    assert accept_plan(None, views, pools, counters) is None
    assert counters.snapshot().fallbacks[FallbackReason.INVALID_PLAN] == 1


def test_pools_free_cpu_unset_leaves_the_field_unset(views):
    request = build_rotation_request(views, PoolSizes(4, 16), 100.0)
    assert not request.snapshot.HasField("free_cpu_blocks")


def test_recheck_leaves_out_a_preempted_request_that_has_finished(views, pools):
    # A step later r-old has finished (its 8 blocks are free): the plan still
    # admits w-late, and preempts nothing.
    response = rotation_pb2.PlanRotationResponse(plan=_plan(["w-late"], ["r-old"]))
    now = [v for v in views if v.request_id == "w-late"]
    counters = FallbackCounters()
    actions = recheck_plan(response, now, PoolSizes(12, 16, 1000), counters)
    assert actions is not None
    assert (actions.resume, actions.preempt) == (("w-late",), ())
    assert counters.snapshot().total_fallbacks == 0
    # The response itself is left as it came.
    assert [d.id for d in response.plan.preempted] == ["r-old"]


@pytest.mark.parametrize(
    ("now_ids", "free_gpu_blocks"),
    [
        # w-late was aborted since the snapshot.
        (["r-old"], 4),
        # r-old has left, and w-late's 5 blocks do not fit in the 4 free:
        # what the plan resumes no longer fits.
        (["w-late"], 4),
    ],
    ids=["resumed-request-gone", "no-room-any-more"],
)
def test_recheck_counts_a_plan_that_no_longer_fits_as_stale(views, pools, now_ids, free_gpu_blocks):
    response = rotation_pb2.PlanRotationResponse(plan=_plan(["w-late"], ["r-old"]))
    now = [v for v in views if v.request_id in now_ids]
    counters = FallbackCounters()
    assert recheck_plan(response, now, PoolSizes(free_gpu_blocks, 16, 1000), counters) is None
    snap = counters.snapshot()
    assert snap.fallbacks[FallbackReason.STALE_PLAN] == 1
    assert snap.total_fallbacks == 1
