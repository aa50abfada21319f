"""The adapter's line to OffloadService: PlanLayerOffload when the engine's
decode batch needs a layer-offload plan, ReportStep after each step it ran
under one. Same contract as PlannerLink: over gRPC or in process, a tight
deadline, and a failed, late or empty answer is None and counted (the engine
then keeps every layer resident, its normal behaviour); planner failures
never raise into the engine."""

from __future__ import annotations

from planner.rpc import RPCS
from planner.v1 import offload_pb2

from .channel import PlannerChannel
from .counters import FallbackCounters, FallbackReason
from .security import ChannelSecurity

# A plan is asked for once per decode window, not every step, and its solve
# is capped by this deadline.
DEFAULT_OFFLOAD_DEADLINE_S = 0.05
_PLAN = RPCS["OffloadService.PlanLayerOffload"]
_REPORT = RPCS["OffloadService.ReportStep"]


class OffloadLink(PlannerChannel):
    """target "host:port" for gRPC; None runs the server's own handler in
    this thread (an answer after the deadline is dropped and counted as a
    deadline fallback). Plans and reports have their own counters."""

    def __init__(
        self,
        target: str | None = None,
        deadline_s: float = DEFAULT_OFFLOAD_DEADLINE_S,
        plan_counters: FallbackCounters | None = None,
        report_counters: FallbackCounters | None = None,
        security: ChannelSecurity | None = None,
    ) -> None:
        super().__init__(target, deadline_s, security=security)
        self.plan_counters = plan_counters or FallbackCounters()
        self.report_counters = report_counters or FallbackCounters()

    def plan_layer_offload(
        self, request: offload_pb2.PlanLayerOffloadRequest
    ) -> offload_pb2.PlanLayerOffloadResponse | None:
        response = self.call(_PLAN, request, self.plan_counters)
        if response is None:
            return None
        assert isinstance(response, offload_pb2.PlanLayerOffloadResponse)
        if not response.HasField("plan"):
            self.plan_counters.record_fallback(FallbackReason.INVALID_PLAN)
            return None
        self.plan_counters.record_ok()
        return response

    def report_step(
        self, request: offload_pb2.ReportStepRequest
    ) -> offload_pb2.ReportStepResponse | None:
        response = self.call(_REPORT, request, self.report_counters)
        if response is None:
            return None
        assert isinstance(response, offload_pb2.ReportStepResponse)
        self.report_counters.record_ok()
        return response
