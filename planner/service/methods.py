"""The function that answers each RPC of planner.rpc. The gRPC server and
`planner call` (in process) both dispatch through this table, so the two
paths cannot drift apart."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

from google.protobuf.message import Message

from planner._version import __version__
from planner.policies.rotation import plan_rotation
from planner.profiles import HARDWARE_PROFILES, MODEL_PROFILES
from planner.rpc import RPCS, SERVICE_NAMES, Rpc
from planner.service.convert.rotation import rotation_plan_to_proto, rotation_request_from_proto
from planner.service.limits import ServiceLimits
from planner.v1 import common_pb2, info_pb2, rotation_pb2

POLICIES = ("rotation/lvf",)


@dataclass(frozen=True, slots=True)
class CallContext:
    """What a handler may know about the call besides its request."""

    limits: ServiceLimits
    # Seconds left before the caller's deadline; None when it set none.
    time_remaining_s: float | None = None


Handler = Callable[[Message, CallContext], Message]


def _plan_rotation(request: Message, ctx: CallContext) -> Message:
    assert isinstance(request, rotation_pb2.PlanRotationRequest)
    snapshot, inputs = rotation_request_from_proto(request, ctx.limits)
    return rotation_plan_to_proto(plan_rotation(snapshot, inputs))


def solver_backends_present() -> list[common_pb2.SolverBackend.ValueType]:
    """Backends whose packages import here."""
    backends = []
    if importlib.util.find_spec("ortools") is not None:
        backends.append(common_pb2.SOLVER_BACKEND_CP_SAT)
    if importlib.util.find_spec("gurobipy") is not None:
        backends.append(common_pb2.SOLVER_BACKEND_GUROBI)
    return backends


def _planner_info(request: Message, ctx: CallContext) -> Message:
    return info_pb2.GetPlannerInfoResponse(
        version=__version__,
        services=SERVICE_NAMES,
        policies=POLICIES,
        solver_backends=solver_backends_present(),
        model_profiles=sorted(MODEL_PROFILES),
        hardware_profiles=sorted(HARDWARE_PROFILES),
        max_requests_per_snapshot=ctx.limits.max_requests_per_snapshot,
        max_message_bytes=ctx.limits.max_message_bytes,
    )


HANDLERS: dict[str, Handler] = {
    "RotationService.PlanRotation": _plan_rotation,
    "PlannerInfoService.GetPlannerInfo": _planner_info,
}
assert HANDLERS.keys() == RPCS.keys(), "every RPC of the contract has a handler"


def handle(rpc: Rpc, request: Message, ctx: CallContext) -> Message:
    return HANDLERS[rpc.short_name](request, ctx)
