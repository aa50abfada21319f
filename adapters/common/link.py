"""The adapter's rotation line to the planner: one PlanRotation call per
engine step, over gRPC or in process, with a tight deadline. A failed, late
or empty answer is None (the engine then runs its own policy for that step)
and is counted; planner failures never raise into the engine."""

from __future__ import annotations

from planner.client import RetryPolicy
from planner.rpc import RPCS
from planner.v1 import rotation_pb2

from .channel import CALL_SWITCH_INTERVAL_S, NO_RETRY, PlannerChannel
from .counters import FallbackCounters, FallbackReason
from .security import ChannelSecurity

DEFAULT_DEADLINE_S = 0.005
_PLAN_ROTATION = RPCS["RotationService.PlanRotation"]

__all__ = ["DEFAULT_DEADLINE_S", "NO_RETRY", "PlannerLink"]


class PlannerLink(PlannerChannel):
    """target "host:port" for gRPC; None for in-process mode (see
    PlannerChannel)."""

    def __init__(
        self,
        target: str | None = None,
        deadline_s: float = DEFAULT_DEADLINE_S,
        counters: FallbackCounters | None = None,
        retry: RetryPolicy = NO_RETRY,
        security: ChannelSecurity | None = None,
        *,
        switch_interval_s: float | None = CALL_SWITCH_INTERVAL_S,
    ) -> None:
        super().__init__(target, deadline_s, retry, security, switch_interval_s=switch_interval_s)
        self.counters = counters or FallbackCounters()

    def plan_rotation(
        self, request: rotation_pb2.PlanRotationRequest
    ) -> rotation_pb2.PlanRotationResponse | None:
        response = self.call(_PLAN_ROTATION, request, self.counters)
        if response is None:
            return None
        if not isinstance(response, rotation_pb2.PlanRotationResponse) or not response.HasField(
            "plan"
        ):
            self.counters.record_fallback(FallbackReason.INVALID_PLAN)
            return None
        self.counters.record_ok()
        return response
