"""The function that answers each RPC of planner.rpc. The gRPC server and
`planner call` (in process) both dispatch through this table, so the two
paths cannot drift apart."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from google.protobuf.message import Message

from planner._version import __version__
from planner.policies.offload.controller import StepObservation
from planner.policies.rotation import plan_rotation
from planner.profiles import HARDWARE_PROFILES, MODEL_PROFILES
from planner.rpc import RPCS, SERVICE_NAMES, Rpc
from planner.service.cluster_methods import (
    decide_restore_rpc,
    evaluate_drop_trigger_rpc,
    get_cluster_state_rpc,
    plan_buddy_groups_rpc,
)
from planner.service.cluster_store import ClusterStore
from planner.service.convert.checks import non_negative, positive
from planner.service.convert.offload import offload_plan_to_proto, offload_request_from_proto
from planner.service.convert.rotation import rotation_plan_to_proto, rotation_request_from_proto
from planner.service.convert.solver import PROTO_BACKENDS
from planner.service.errors import InvalidArgumentError
from planner.service.limits import ServiceLimits
from planner.service.offload_engines import OffloadEngines
from planner.service.placement_ledger import (
    LedgerStore,
    allocate_memory_rpc,
    free_memory_rpc,
    get_pool_status_rpc,
    offer_memory_rpc,
    reclaim_memory_rpc,
)
from planner.service.placement_methods import (
    classify_roles_rpc,
    match_producers_rpc,
    partition_batch_rpc,
    place_models_rpc,
)
from planner.service.role_oracles import RoleOracles
from planner.service.serverless_methods import (
    choose_chunk_size_rpc,
    choose_kernel_rpc,
    get_knob_state_rpc,
    plan_model_placement_rpc,
    report_knob_feedback_rpc,
    route_rpc,
    schedule_waiting_rpc,
)
from planner.service.serverless_tuners import ServerlessTuners
from planner.solvers import available_backends
from planner.v1 import (
    cluster_pb2,
    common_pb2,
    info_pb2,
    offload_pb2,
    placement_pb2,
    rotation_pb2,
    serverless_pb2,
)


@dataclass(frozen=True, slots=True)
class CallContext:
    """What a handler may know about the call besides its request."""

    limits: ServiceLimits
    # Seconds left before the caller's deadline; None when it set none.
    time_remaining_s: float | None = None
    # Per-engine offload controllers (one registry per server process).
    offload_engines: OffloadEngines = field(default_factory=OffloadEngines)
    # ClusterService state (durable when the server has a store path; in
    # memory, opened on first use, otherwise).
    cluster_store: ClusterStore = field(default_factory=ClusterStore)
    # ServerlessService's rho tuners, one per (GPU, slice).
    serverless_tuners: ServerlessTuners = field(default_factory=ServerlessTuners)
    # ClassifyRoles' oracle for deployments named by a profile (the replay
    # simulator, handed in by whoever starts the service); None refuses them.
    role_oracles: RoleOracles | None = None
    # GetPlannerInfo's policies, kind/name: the policy registries' listing
    # (planner.replay.policy_registries.served_policies), handed in by
    # whoever starts the service like the role oracles.
    policies: tuple[str, ...] = ()


Handler = Callable[[Message, CallContext], Message]
R = TypeVar("R", bound=Message)


def _on(request_type: type[R], answer: Callable[[R, CallContext], Message]) -> Handler:
    """The handler that answers requests of request_type."""

    def handler(request: Message, ctx: CallContext) -> Message:
        assert isinstance(request, request_type)
        return answer(request, ctx)

    return handler


def _plan_rotation(request: rotation_pb2.PlanRotationRequest, ctx: CallContext) -> Message:
    snapshot, inputs = rotation_request_from_proto(request, ctx.limits)
    return rotation_plan_to_proto(plan_rotation(snapshot, inputs))


# Leaves room for step + window in the plan's int64 expiry_step.
MAX_STEP = 1 << 62


def _check_step(step: int) -> None:
    if not 0 <= step <= MAX_STEP:
        raise InvalidArgumentError("step", f"must be in [0, {MAX_STEP}], got {step}")


def _plan_layer_offload(request: offload_pb2.PlanLayerOffloadRequest, ctx: CallContext) -> Message:
    batch, inputs = offload_request_from_proto(request, ctx.limits, ctx.time_remaining_s)
    _check_step(request.step)
    try:
        plan = ctx.offload_engines.plan(request.engine_id, batch, inputs, request.step)
    except ValueError as exc:  # a backend that cannot take this model (e.g. too large)
        raise InvalidArgumentError("solver.backend", str(exc)) from None
    return offload_plan_to_proto(plan)


_REASONS = {
    "no_plan": offload_pb2.REPLAN_REASON_NO_PLAN,
    "batch_change": offload_pb2.REPLAN_REASON_BATCH_CHANGE,
    "profile_mismatch": offload_pb2.REPLAN_REASON_PROFILE_MISMATCH,
    "expiry": offload_pb2.REPLAN_REASON_EXPIRY,
}


def _report_step(request: offload_pb2.ReportStepRequest, ctx: CallContext) -> Message:
    if not request.engine_id:
        raise InvalidArgumentError("engine_id", "must name the engine that asked for the plan")
    _check_step(request.step)
    positive("observed_step_s", request.observed_step_s)
    for i, c in enumerate(request.observed_layer_compute_s):
        non_negative(f"observed_layer_compute_s[{i}]", c)
    if request.observed_link_blocks_per_s:
        positive("observed_link_blocks_per_s", request.observed_link_blocks_per_s)
    observation = StepObservation(
        step=request.step,
        request_ids=list(request.batch_ids),
        observed_step_s=request.observed_step_s,
        layer_comp_s=list(request.observed_layer_compute_s) or None,
        bandwidth_blocks_per_s=request.observed_link_blocks_per_s or None,
    )
    try:
        decision = ctx.offload_engines.report(request.engine_id, observation)
    except ValueError as exc:
        raise InvalidArgumentError("observed_layer_compute_s", str(exc)) from None
    if decision is None:
        return offload_pb2.ReportStepResponse(replan=True, reason=offload_pb2.REPLAN_REASON_NO_PLAN)
    return offload_pb2.ReportStepResponse(
        replan=decision.replan,
        reason=_REASONS[decision.reason] if decision.reason else offload_pb2.REPLAN_REASON_NONE,
        predicted_step_s=observation.predicted_step_s or 0.0,
        layer_compute_s=decision.comp_s,
        link_blocks_per_s=decision.bandwidth_blocks_per_s,
    )


def solver_backends_present() -> list[common_pb2.SolverBackend.ValueType]:
    """Registered backends whose packages import here (planner.solvers)."""
    return [PROTO_BACKENDS[b] for b in available_backends()]


def _planner_info(request: info_pb2.GetPlannerInfoRequest, ctx: CallContext) -> Message:
    return info_pb2.GetPlannerInfoResponse(
        version=__version__,
        services=SERVICE_NAMES,
        policies=ctx.policies,
        solver_backends=solver_backends_present(),
        model_profiles=sorted(MODEL_PROFILES),
        hardware_profiles=sorted(HARDWARE_PROFILES),
        max_requests_per_snapshot=ctx.limits.max_requests_per_snapshot,
        max_message_bytes=ctx.limits.max_message_bytes,
    )


def _ledger(ctx: CallContext) -> LedgerStore:
    """The lease ledger, in the same store as ClusterService's state."""
    return ctx.cluster_store.ledger


HANDLERS: dict[str, Handler] = {
    "RotationService.PlanRotation": _on(rotation_pb2.PlanRotationRequest, _plan_rotation),
    "OffloadService.PlanLayerOffload": _on(
        offload_pb2.PlanLayerOffloadRequest, _plan_layer_offload
    ),
    "OffloadService.ReportStep": _on(offload_pb2.ReportStepRequest, _report_step),
    "ClusterService.PlanBuddyGroups": _on(
        cluster_pb2.PlanBuddyGroupsRequest,
        lambda r, c: plan_buddy_groups_rpc(r, c.limits, c.cluster_store, c.time_remaining_s),
    ),
    "ClusterService.EvaluateDropTrigger": _on(
        cluster_pb2.EvaluateDropTriggerRequest,
        lambda r, c: evaluate_drop_trigger_rpc(r, c.limits, c.cluster_store),
    ),
    "ClusterService.DecideRestore": _on(
        cluster_pb2.DecideRestoreRequest,
        lambda r, c: decide_restore_rpc(r, c.limits, c.cluster_store),
    ),
    "ClusterService.GetClusterState": _on(
        cluster_pb2.GetClusterStateRequest, lambda r, c: get_cluster_state_rpc(r, c.cluster_store)
    ),
    "PlacementService.ClassifyRoles": _on(
        placement_pb2.ClassifyRolesRequest, lambda r, c: classify_roles_rpc(r, c.role_oracles)
    ),
    "PlacementService.PlaceModels": _on(
        placement_pb2.PlaceModelsRequest, lambda r, c: place_models_rpc(r, c.time_remaining_s)
    ),
    "PlacementService.MatchProducers": _on(
        placement_pb2.MatchProducersRequest, lambda r, c: match_producers_rpc(r)
    ),
    "PlacementService.OfferMemory": _on(
        placement_pb2.OfferMemoryRequest, lambda r, c: offer_memory_rpc(r, _ledger(c))
    ),
    "PlacementService.AllocateMemory": _on(
        placement_pb2.AllocateMemoryRequest, lambda r, c: allocate_memory_rpc(r, _ledger(c))
    ),
    "PlacementService.FreeMemory": _on(
        placement_pb2.FreeMemoryRequest, lambda r, c: free_memory_rpc(r, _ledger(c))
    ),
    "PlacementService.ReclaimMemory": _on(
        placement_pb2.ReclaimMemoryRequest, lambda r, c: reclaim_memory_rpc(r, _ledger(c))
    ),
    "PlacementService.GetPoolStatus": _on(
        placement_pb2.GetPoolStatusRequest, lambda r, c: get_pool_status_rpc(r, _ledger(c))
    ),
    "PlacementService.PartitionBatch": _on(
        placement_pb2.PartitionBatchRequest, lambda r, c: partition_batch_rpc(r)
    ),
    "ServerlessService.PlanModelPlacement": _on(
        serverless_pb2.PlanModelPlacementRequest,
        lambda r, c: plan_model_placement_rpc(r, c.time_remaining_s),
    ),
    "ServerlessService.Route": _on(serverless_pb2.RouteRequest, lambda r, c: route_rpc(r)),
    "ServerlessService.ScheduleWaiting": _on(
        serverless_pb2.ScheduleWaitingRequest, lambda r, c: schedule_waiting_rpc(r)
    ),
    "ServerlessService.ChooseChunkSize": _on(
        serverless_pb2.ChooseChunkSizeRequest, lambda r, c: choose_chunk_size_rpc(r)
    ),
    "ServerlessService.ChooseKernel": _on(
        serverless_pb2.ChooseKernelRequest, lambda r, c: choose_kernel_rpc(r, c.serverless_tuners)
    ),
    "ServerlessService.ReportKnobFeedback": _on(
        serverless_pb2.ReportKnobFeedbackRequest,
        lambda r, c: report_knob_feedback_rpc(r, c.serverless_tuners),
    ),
    "ServerlessService.GetKnobState": _on(
        serverless_pb2.GetKnobStateRequest,
        lambda r, c: get_knob_state_rpc(r, c.serverless_tuners),
    ),
    "PlannerInfoService.GetPlannerInfo": _on(info_pb2.GetPlannerInfoRequest, _planner_info),
}
assert HANDLERS.keys() == RPCS.keys(), "every RPC of the contract has a handler"


def handle(rpc: Rpc, request: Message, ctx: CallContext) -> Message:
    return HANDLERS[rpc.short_name](request, ctx)
