"""The function that answers each RPC of planner.rpc. The gRPC server and
`planner call` (in process) both dispatch through this table, so the two
paths cannot drift apart."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

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


def _plan_rotation(request: Message, ctx: CallContext) -> Message:
    assert isinstance(request, rotation_pb2.PlanRotationRequest)
    snapshot, inputs = rotation_request_from_proto(request, ctx.limits)
    return rotation_plan_to_proto(plan_rotation(snapshot, inputs))


# Leaves room for step + window in the plan's int64 expiry_step.
MAX_STEP = 1 << 62


def _check_step(step: int) -> None:
    if not 0 <= step <= MAX_STEP:
        raise InvalidArgumentError("step", f"must be in [0, {MAX_STEP}], got {step}")


def _plan_layer_offload(request: Message, ctx: CallContext) -> Message:
    assert isinstance(request, offload_pb2.PlanLayerOffloadRequest)
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


def _report_step(request: Message, ctx: CallContext) -> Message:
    assert isinstance(request, offload_pb2.ReportStepRequest)
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


def _plan_buddy_groups(request: Message, ctx: CallContext) -> Message:
    assert isinstance(request, cluster_pb2.PlanBuddyGroupsRequest)
    return plan_buddy_groups_rpc(request, ctx.limits, ctx.cluster_store, ctx.time_remaining_s)


def _evaluate_drop_trigger(request: Message, ctx: CallContext) -> Message:
    assert isinstance(request, cluster_pb2.EvaluateDropTriggerRequest)
    return evaluate_drop_trigger_rpc(request, ctx.limits, ctx.cluster_store)


def _decide_restore(request: Message, ctx: CallContext) -> Message:
    assert isinstance(request, cluster_pb2.DecideRestoreRequest)
    return decide_restore_rpc(request, ctx.limits, ctx.cluster_store)


def _get_cluster_state(request: Message, ctx: CallContext) -> Message:
    assert isinstance(request, cluster_pb2.GetClusterStateRequest)
    return get_cluster_state_rpc(request, ctx.cluster_store)


def _ledger(ctx: CallContext) -> LedgerStore:
    """The lease ledger, in the same store as ClusterService's state."""
    return ctx.cluster_store.ledger


def _classify_roles(request: Message, ctx: CallContext) -> Message:
    assert isinstance(request, placement_pb2.ClassifyRolesRequest)
    return classify_roles_rpc(request, ctx.role_oracles)


def _place_models(request: Message, ctx: CallContext) -> Message:
    assert isinstance(request, placement_pb2.PlaceModelsRequest)
    return place_models_rpc(request, ctx.time_remaining_s)


def _match_producers(request: Message, ctx: CallContext) -> Message:
    assert isinstance(request, placement_pb2.MatchProducersRequest)
    return match_producers_rpc(request)


def _offer_memory(request: Message, ctx: CallContext) -> Message:
    assert isinstance(request, placement_pb2.OfferMemoryRequest)
    return offer_memory_rpc(request, _ledger(ctx))


def _allocate_memory(request: Message, ctx: CallContext) -> Message:
    assert isinstance(request, placement_pb2.AllocateMemoryRequest)
    return allocate_memory_rpc(request, _ledger(ctx))


def _free_memory(request: Message, ctx: CallContext) -> Message:
    assert isinstance(request, placement_pb2.FreeMemoryRequest)
    return free_memory_rpc(request, _ledger(ctx))


def _reclaim_memory(request: Message, ctx: CallContext) -> Message:
    assert isinstance(request, placement_pb2.ReclaimMemoryRequest)
    return reclaim_memory_rpc(request, _ledger(ctx))


def _get_pool_status(request: Message, ctx: CallContext) -> Message:
    assert isinstance(request, placement_pb2.GetPoolStatusRequest)
    return get_pool_status_rpc(request, _ledger(ctx))


def _partition_batch(request: Message, ctx: CallContext) -> Message:
    assert isinstance(request, placement_pb2.PartitionBatchRequest)
    return partition_batch_rpc(request)


def _plan_model_placement(request: Message, ctx: CallContext) -> Message:
    assert isinstance(request, serverless_pb2.PlanModelPlacementRequest)
    return plan_model_placement_rpc(request, ctx.time_remaining_s)


def _route(request: Message, ctx: CallContext) -> Message:
    assert isinstance(request, serverless_pb2.RouteRequest)
    return route_rpc(request)


def _schedule_waiting(request: Message, ctx: CallContext) -> Message:
    assert isinstance(request, serverless_pb2.ScheduleWaitingRequest)
    return schedule_waiting_rpc(request)


def _choose_chunk_size(request: Message, ctx: CallContext) -> Message:
    assert isinstance(request, serverless_pb2.ChooseChunkSizeRequest)
    return choose_chunk_size_rpc(request)


def _choose_kernel(request: Message, ctx: CallContext) -> Message:
    assert isinstance(request, serverless_pb2.ChooseKernelRequest)
    return choose_kernel_rpc(request, ctx.serverless_tuners)


def _report_knob_feedback(request: Message, ctx: CallContext) -> Message:
    assert isinstance(request, serverless_pb2.ReportKnobFeedbackRequest)
    return report_knob_feedback_rpc(request, ctx.serverless_tuners)


def _get_knob_state(request: Message, ctx: CallContext) -> Message:
    assert isinstance(request, serverless_pb2.GetKnobStateRequest)
    return get_knob_state_rpc(request, ctx.serverless_tuners)


def solver_backends_present() -> list[common_pb2.SolverBackend.ValueType]:
    """Registered backends whose packages import here (planner.solvers)."""
    return [PROTO_BACKENDS[b] for b in available_backends()]


def _planner_info(request: Message, ctx: CallContext) -> Message:
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


HANDLERS: dict[str, Handler] = {
    "RotationService.PlanRotation": _plan_rotation,
    "OffloadService.PlanLayerOffload": _plan_layer_offload,
    "OffloadService.ReportStep": _report_step,
    "ClusterService.PlanBuddyGroups": _plan_buddy_groups,
    "ClusterService.EvaluateDropTrigger": _evaluate_drop_trigger,
    "ClusterService.DecideRestore": _decide_restore,
    "ClusterService.GetClusterState": _get_cluster_state,
    "PlacementService.ClassifyRoles": _classify_roles,
    "PlacementService.PlaceModels": _place_models,
    "PlacementService.MatchProducers": _match_producers,
    "PlacementService.OfferMemory": _offer_memory,
    "PlacementService.AllocateMemory": _allocate_memory,
    "PlacementService.FreeMemory": _free_memory,
    "PlacementService.ReclaimMemory": _reclaim_memory,
    "PlacementService.GetPoolStatus": _get_pool_status,
    "PlacementService.PartitionBatch": _partition_batch,
    "ServerlessService.PlanModelPlacement": _plan_model_placement,
    "ServerlessService.Route": _route,
    "ServerlessService.ScheduleWaiting": _schedule_waiting,
    "ServerlessService.ChooseChunkSize": _choose_chunk_size,
    "ServerlessService.ChooseKernel": _choose_kernel,
    "ServerlessService.ReportKnobFeedback": _report_knob_feedback,
    "ServerlessService.GetKnobState": _get_knob_state,
    "PlannerInfoService.GetPlannerInfo": _planner_info,
}
assert HANDLERS.keys() == RPCS.keys(), "every RPC of the contract has a handler"


def handle(rpc: Rpc, request: Message, ctx: CallContext) -> Message:
    return HANDLERS[rpc.short_name](request, ctx)
