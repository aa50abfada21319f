"""The adapter's line to OffloadService: PlanLayerOffload when the engine's
decode batch needs a layer-offload plan, ReportStep after each step it ran
under one. Same contract as PlannerLink: over gRPC or in process, a tight
deadline, and a failed, late or empty answer is None and counted (the engine
then keeps every layer resident, its normal behaviour); planner failures
never raise into the engine."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType

from google.protobuf.message import Message

from planner.client import PlannerClient, PlannerError
from planner.rpc import RPCS, Rpc
from planner.v1 import offload_pb2

from .counters import FallbackCounters, FallbackReason
from .link import NO_RETRY, _reason

# A plan is asked for once per decode window, not every step, and its solve
# is capped by this deadline.
DEFAULT_OFFLOAD_DEADLINE_S = 0.05
_PLAN = RPCS["OffloadService.PlanLayerOffload"]
_REPORT = RPCS["OffloadService.ReportStep"]


class OffloadLink:
    """target "host:port" for gRPC; None runs the server's own handler in
    this thread (an answer after the deadline is dropped and counted as a
    deadline fallback). Plans and reports have their own counters."""

    def __init__(
        self,
        target: str | None = None,
        deadline_s: float = DEFAULT_OFFLOAD_DEADLINE_S,
        plan_counters: FallbackCounters | None = None,
        report_counters: FallbackCounters | None = None,
    ) -> None:
        if not deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
        self.target = target
        self.deadline_s = deadline_s
        self.plan_counters = plan_counters or FallbackCounters()
        self.report_counters = report_counters or FallbackCounters()
        self._client = (
            PlannerClient(target, deadline_s=deadline_s, retry=NO_RETRY)
            if target is not None
            else None
        )
        self._local: Callable[[Rpc, Message], Message] | None = None

    @property
    def in_process(self) -> bool:
        return self._client is None

    def plan_layer_offload(
        self, request: offload_pb2.PlanLayerOffloadRequest
    ) -> offload_pb2.PlanLayerOffloadResponse | None:
        response = self._call(_PLAN, request, self.plan_counters)
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
        response = self._call(_REPORT, request, self.report_counters)
        if response is None:
            return None
        assert isinstance(response, offload_pb2.ReportStepResponse)
        self.report_counters.record_ok()
        return response

    def _call(self, rpc: Rpc, request: Message, counters: FallbackCounters) -> Message | None:
        start = time.perf_counter()
        response, reason = self._ask(rpc, request)
        elapsed = time.perf_counter() - start
        counters.record_call(elapsed)
        if reason is None and elapsed > self.deadline_s and self.in_process:
            reason = FallbackReason.DEADLINE
        if reason is not None:
            counters.record_fallback(reason)
            return None
        return response

    def _ask(self, rpc: Rpc, request: Message) -> tuple[Message | None, FallbackReason | None]:
        try:
            if self._client is not None:
                return self._client.call(rpc, request), None
            if self._local is None:
                self._local = _in_process_handler(self.deadline_s)
            return self._local(rpc, request), None
        except PlannerError as exc:
            return None, _reason(exc.code)
        except Exception:
            # Whatever the planner does wrong, the engine keeps running.
            return None, FallbackReason.ERROR

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def __enter__(self) -> OffloadLink:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _in_process_handler(deadline_s: float) -> Callable[[Rpc, Message], Message]:
    # The service's handler table, imported only in this mode (DESIGN.md §1).
    # One context for the link's life: OffloadService keeps each engine's
    # controller in it between calls, as a server would.
    from planner.service.limits import ServiceLimits
    from planner.service.methods import CallContext, handle

    ctx = CallContext(ServiceLimits(), deadline_s)
    return lambda rpc, request: handle(rpc, request, ctx)
