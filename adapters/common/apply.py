"""Checking a rotation plan against the snapshot it answers (and, when it
arrives a step later, against the engine as it is then) and turning it into
engine-neutral actions. A plan that names an unknown request, resumes and
preempts the same one, or resumes more than fits is rejected whole."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.v1 import rotation_pb2

from .counters import FallbackCounters, FallbackReason
from .snapshot import EngineRequestView, PoolSizes, ViewState, blocks_to_resume


class InvalidPlanError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class BlockMoves:
    """Logical block logical_index[i] of request_id moves from
    src_block_ids[i] to dst_block_ids[i]."""

    request_id: str
    logical_index: tuple[int, ...]
    src_block_ids: tuple[int, ...]
    dst_block_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PlanActions:
    # No contention: the engine's own order admits everyone.
    fcfs: bool
    # Non-running requests to bring in, in this order.
    resume: tuple[str, ...]
    # Running requests to take off the GPU.
    preempt: tuple[str, ...]
    # Picked, but brought in next step: the GPU blocks they would land in
    # are still being copied out this step.
    deferred: tuple[str, ...] = ()
    # Block-level plans only (empty for counts-only snapshots).
    swap_out: tuple[BlockMoves, ...] = ()
    swap_in: tuple[BlockMoves, ...] = ()
    eager: tuple[BlockMoves, ...] = ()


def plan_actions(
    plan: rotation_pb2.RotationPlan,
    views: Sequence[EngineRequestView],
    pools: PoolSizes,
) -> PlanActions:
    """Raises InvalidPlanError naming what is wrong."""
    by_id = {v.request_id: v for v in views}
    resume = tuple(d.id for d in plan.prioritized)
    preempt = tuple(d.id for d in plan.preempted)
    for field, ids in (("prioritized", resume), ("preempted", preempt)):
        seen: set[str] = set()
        for i, rid in enumerate(ids):
            if rid not in by_id:
                raise InvalidPlanError(f"{field}[{i}]: unknown request {rid!r}")
            if rid in seen:
                raise InvalidPlanError(f"{field}[{i}]: request {rid!r} listed twice")
            seen.add(rid)
    both = set(resume) & set(preempt)
    if both:
        raise InvalidPlanError(f"requests both resumed and preempted: {sorted(both)}")
    for i, rid in enumerate(preempt):
        if by_id[rid].state is not ViewState.RUNNING:
            raise InvalidPlanError(f"preempted[{i}]: request {rid!r} is not running")
    size = pools.block_size_tokens
    need = 0
    for i, rid in enumerate(resume):
        view = by_id[rid]
        if view.state is ViewState.RUNNING:
            raise InvalidPlanError(f"prioritized[{i}]: request {rid!r} is already running")
        need += blocks_to_resume(view, size)
    room = pools.free_gpu_blocks + sum(by_id[rid].gpu_blocks for rid in preempt)
    if need > room:
        raise InvalidPlanError(
            f"resumes {need} blocks, only {room} free after preemption "
            f"({pools.free_gpu_blocks} free + what the preempted hold)"
        )
    moves = {kind: _moves(plan, kind, by_id) for kind in _KINDS}
    return PlanActions(
        fcfs=plan.fcfs_fallback,
        resume=resume,
        preempt=preempt,
        deferred=tuple(plan.explanation.deferred_swap_in_ids),
        swap_out=moves[rotation_pb2.MOVE_KIND_SWAP_OUT],
        swap_in=moves[rotation_pb2.MOVE_KIND_SWAP_IN],
        eager=moves[rotation_pb2.MOVE_KIND_EAGER],
    )


def accept_plan(
    response: rotation_pb2.PlanRotationResponse | None,
    views: Sequence[EngineRequestView],
    pools: PoolSizes,
    counters: FallbackCounters,
) -> PlanActions | None:
    """The actions of an answer, or None (engine's own policy this step) when
    there was no answer or the plan is invalid (counted as invalid-plan)."""
    if response is None:
        return None
    try:
        return plan_actions(response.plan, views, pools)
    except InvalidPlanError:
        counters.record_fallback(FallbackReason.INVALID_PLAN)
        return None


def recheck_plan(
    response: rotation_pb2.PlanRotationResponse,
    views: Sequence[EngineRequestView],
    pools: PoolSizes,
    counters: FallbackCounters,
) -> PlanActions | None:
    """A plan that was right for the snapshot it answered, checked again
    against the engine as it is when the plan arrives (pipelined planning:
    a step later). views: the requests the engine still has (those the plan
    names are enough). A running request the plan preempts that has left
    the engine since (finished) is left out: its blocks are free already.
    Its actions, or None (engine's own policy this step) counted as
    stale-plan when the rest no longer fits: a request it resumes has left,
    one it names has changed state, or what it resumes no longer fits."""
    plan = response.plan
    present = {v.request_id for v in views}
    if any(d.id not in present for d in plan.preempted):
        plan = rotation_pb2.RotationPlan()
        plan.CopyFrom(response.plan)
        del plan.preempted[:]
        plan.preempted.extend(d for d in response.plan.preempted if d.id in present)
    try:
        return plan_actions(plan, views, pools)
    except InvalidPlanError:
        counters.record_fallback(FallbackReason.STALE_PLAN)
        return None


_KINDS = (
    rotation_pb2.MOVE_KIND_SWAP_OUT,
    rotation_pb2.MOVE_KIND_SWAP_IN,
    rotation_pb2.MOVE_KIND_EAGER,
)


def _moves(
    plan: rotation_pb2.RotationPlan,
    kind: rotation_pb2.MoveKind.ValueType,
    by_id: dict[str, EngineRequestView],
) -> tuple[BlockMoves, ...]:
    out = []
    for i, m in enumerate(plan.moves):
        if m.kind != kind:
            continue
        if m.id not in by_id:
            raise InvalidPlanError(f"moves[{i}]: unknown request {m.id!r}")
        if not len(m.logical_index) == len(m.src_block_ids) == len(m.dst_block_ids):
            raise InvalidPlanError(f"moves[{i}]: index, source and destination lengths differ")
        out.append(
            BlockMoves(m.id, tuple(m.logical_index), tuple(m.src_block_ids), tuple(m.dst_block_ids))
        )
    return tuple(out)
