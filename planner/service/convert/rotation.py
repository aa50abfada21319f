"""RotationService messages <-> the rotation policy's inputs and plan."""

from __future__ import annotations

from typing import Any

from planner.domain.requests import Snapshot
from planner.domain.rotation import (
    RequestDecision,
    RotationInputs,
    RotationParams,
    RotationPlan,
    RotationVariant,
)
from planner.service.convert.checks import block_count, finite, non_negative
from planner.service.convert.common import hardware_from_proto, model_from_proto, slo_from_proto
from planner.service.convert.snapshot import snapshot_from_proto
from planner.service.errors import InvalidArgumentError
from planner.service.limits import ServiceLimits
from planner.v1 import rotation_pb2

MAX_FACTOR = 1e9


def params_from_proto(field: str, msg: rotation_pb2.RotationParams) -> RotationParams:
    defaults = RotationParams()
    return RotationParams(
        alpha=_factor(f"{field}.alpha", non_negative(f"{field}.alpha", msg.alpha))
        if msg.HasField("alpha")
        else defaults.alpha,
        beta_tbt=_factor(f"{field}.beta_tbt", msg.beta_tbt)
        if msg.HasField("beta_tbt")
        else defaults.beta_tbt,
        beta_ttft=_factor(f"{field}.beta_ttft", msg.beta_ttft)
        if msg.HasField("beta_ttft")
        else defaults.beta_ttft,
        transfer_budget_blocks=block_count(
            f"{field}.transfer_budget_blocks", msg.transfer_budget_blocks
        )
        if msg.HasField("transfer_budget_blocks")
        else None,
        eager_budget_blocks=block_count(f"{field}.eager_budget_blocks", msg.eager_budget_blocks)
        if msg.HasField("eager_budget_blocks")
        else None,
        variant=_variant(f"{field}.variant", msg.variant),
        preempt_slack_tbts=_factor(f"{field}.preempt_slack_tbts", msg.preempt_slack_tbts)
        if msg.HasField("preempt_slack_tbts")
        else defaults.preempt_slack_tbts,
        resume_slack_tbts=_factor(f"{field}.resume_slack_tbts", msg.resume_slack_tbts)
        if msg.HasField("resume_slack_tbts")
        else defaults.resume_slack_tbts,
        lost_slack_tbts=_lost_slack(f"{field}.lost_slack_tbts", msg, defaults.lost_slack_tbts),
    )


def _variant(field: str, value: int) -> RotationVariant:
    if value == 0:
        return RotationVariant.LVF
    try:
        return RotationVariant(value)
    except ValueError:
        names = ", ".join(f"ROTATION_VARIANT_{v.name}" for v in RotationVariant)
        raise InvalidArgumentError(field, f"must be one of {names}, got {value}") from None


def _lost_slack(
    field: str, msg: rotation_pb2.RotationParams, default: float | None
) -> float | None:
    if not msg.HasField("lost_slack_tbts"):
        return default
    value = _factor(field, msg.lost_slack_tbts)
    return None if value < 0 else value


def _factor(field: str, value: float) -> float:
    """A weight or a slack in TBTs: beyond a billion it is a unit mistake
    (and times a bounded SLO it stays a finite float)."""
    if not abs(finite(field, value)) <= MAX_FACTOR:
        raise InvalidArgumentError(
            field, f"must be in [-{MAX_FACTOR:g}, {MAX_FACTOR:g}], got {value}"
        )
    return value


def rotation_request_from_proto(
    msg: rotation_pb2.PlanRotationRequest, limits: ServiceLimits
) -> tuple[Snapshot, RotationInputs]:
    snapshot = snapshot_from_proto("snapshot", msg.snapshot, limits, msg.HasField("snapshot"))
    inputs = RotationInputs(
        params=params_from_proto("params", msg.params),
        slo=slo_from_proto("slo", msg.slo),
        model=model_from_proto("profile", msg.profile),
        hardware=hardware_from_proto("profile", msg.profile),
    )
    return snapshot, inputs


def _decisions(decisions: tuple[RequestDecision, ...]) -> Any:
    # Dicts: the protobuf runtime builds repeated messages from them about
    # three times faster than from message objects.
    return [
        {"id": d.id, "state": int(d.state), "vlt": d.vlt, "blocks": d.blocks} for d in decisions
    ]


def rotation_plan_to_proto(plan: RotationPlan) -> rotation_pb2.PlanRotationResponse:
    e = plan.explanation
    explanation = rotation_pb2.RotationExplanation(
        transfer_budget_blocks=e.transfer_budget_blocks,
        budget_source=rotation_pb2.BudgetSource.ValueType(e.budget_source),
        free_gpu_blocks=e.free_gpu_blocks,
        blocks_needed=e.blocks_needed,
        blocks_left=e.blocks_left,
        swap_blocks_needed=e.swap_blocks_needed,
        blocks_released_now=e.blocks_released_now,
        blocks_freed_after_d2h=e.blocks_freed_after_d2h,
        swap_in_blocks=e.swap_in_blocks,
        swap_out_blocks=e.swap_out_blocks,
        eager_blocks=e.eager_blocks,
        unmet_swap_blocks=e.unmet_swap_blocks,
        deferred_swap_in_ids=e.deferred_swap_in_ids,
        cpu_full_skipped_ids=e.cpu_full_skipped_ids,
        trimmed_ids=e.trimmed_ids,
        summary=e.summary,
        variant=rotation_pb2.RotationVariant.ValueType(e.variant),
        d2h_budget_blocks=e.d2h_budget_blocks,
        link_half_duplex=e.link_half_duplex,
        held_engine_full=e.held.engine_full,
        held_link_full=e.held.link_full,
        held_not_lagging=e.held.not_lagging,
        held_no_victim=e.held.no_victim,
    )
    batches = [
        rotation_pb2.TransferBatch(
            direction=rotation_pb2.CopyDirection.ValueType(b.direction),
            extents=[
                rotation_pb2.BlockExtent(
                    src_start=x.src_start, dst_start=x.dst_start, num_blocks=x.num_blocks
                )
                for x in b.extents
            ],
            num_blocks=b.num_blocks,
            num_bytes=b.num_bytes,
        )
        for b in plan.batches
    ]
    moves = [
        rotation_pb2.RequestBlockMoves(
            id=m.id,
            kind=rotation_pb2.MoveKind.ValueType(m.kind),
            logical_index=m.logical_index,
            src_block_ids=m.src_block_ids,
            dst_block_ids=m.dst_block_ids,
        )
        for m in plan.moves
    ]
    return rotation_pb2.PlanRotationResponse(
        plan=rotation_pb2.RotationPlan(
            fcfs_fallback=plan.fcfs_fallback,
            prioritized=_decisions(plan.prioritized),
            preempted=_decisions(plan.preempted),
            batches=batches,
            moves=moves,
            released_gpu_block_ids=plan.released_gpu_block_ids,
            freed_after_d2h_gpu_block_ids=plan.freed_after_d2h_gpu_block_ids,
            explanation=explanation,
        )
    )
