"""The adapter's rotation line to the planner: one PlanRotation call per
engine step, over gRPC or in process, with a tight deadline. A failed, late
or empty answer is None (the engine then runs its own policy for that step)
and is counted; planner failures never raise into the engine.

Two ways to call: plan_rotation waits for the answer (synchronous: the call
is on the step's critical path); PlanPipeline sends the call after one step
is scheduled and takes the answer at the next (pipelined: the call runs
while the model computes, see pending.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from google.protobuf.message import Message

from planner.client import RetryPolicy
from planner.rpc import RPCS
from planner.v1 import rotation_pb2

from .channel import CALL_SWITCH_INTERVAL_S, NO_RETRY, PipelinedSend, PlannerChannel
from .counters import FallbackCounters, FallbackReason
from .pending import PendingCall
from .security import ChannelSecurity

DEFAULT_DEADLINE_S = 0.005
# A pipelined call is cut here over gRPC: an answer is of use only until the
# engine's next step, and the sending thread takes no new call before.
PIPELINED_CALL_TIMEOUT_S = 0.1
_PLAN_ROTATION = RPCS["RotationService.PlanRotation"]

__all__ = [
    "DEFAULT_DEADLINE_S",
    "NO_RETRY",
    "PIPELINED_CALL_TIMEOUT_S",
    "PlanPipeline",
    "PlannerLink",
]
Context = TypeVar("Context")


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
        pipelined_send: PipelinedSend = "sender-thread",
        call_timing_log: str | None = None,
    ) -> None:
        super().__init__(
            target,
            deadline_s,
            retry,
            security,
            switch_interval_s=switch_interval_s,
            pipelined_send=pipelined_send,
            call_timing_log=call_timing_log,
        )
        self.counters = counters or FallbackCounters()

    def plan_rotation(
        self, request: rotation_pb2.PlanRotationRequest
    ) -> rotation_pb2.PlanRotationResponse | None:
        """Waits for the answer, at most the deadline."""
        return self._rotation_answer(self.call(_PLAN_ROTATION, request, self.counters))

    def send_rotation(
        self,
        request: rotation_pb2.PlanRotationRequest,
        timeout_s: float = PIPELINED_CALL_TIMEOUT_S,
    ) -> PendingCall:
        """Sends the call and returns at once (see PlanPipeline). Over gRPC
        the call is cut after max(timeout_s, deadline)."""
        limit_s = max(timeout_s, self.deadline_s)
        return PendingCall(
            lambda: self.send(_PLAN_ROTATION, request, limit_s),
            self.deadline_s,
            switch_interval_s=self.switch_interval_s,
        )

    def take_rotation(self, pending: PendingCall) -> rotation_pb2.PlanRotationResponse | None:
        """The answer of an ended sent call (None: a counted fallback)."""
        return self._rotation_answer(pending.take(self.counters))

    def _rotation_answer(
        self, response: Message | None
    ) -> rotation_pb2.PlanRotationResponse | None:
        if response is None:
            return None
        if not isinstance(response, rotation_pb2.PlanRotationResponse) or not response.HasField(
            "plan"
        ):
            self.counters.record_fallback(FallbackReason.INVALID_PLAN)
            return None
        self.counters.record_ok()
        return response


@dataclass(frozen=True, slots=True)
class _InFlight(Generic[Context]):
    call: PendingCall
    context: Context


class PlanPipeline(Generic[Context]):
    """Pipelined rotation planning for one engine: at most one call in
    flight, with what the engine needs to check its answer (context: the
    snapshot it was built from).

    After scheduling a step, the engine sends a snapshot (send, when nothing
    is in flight); when scheduling the next, it takes the answer (take). A
    step waits for it only while the call is younger than the deadline. A
    call still running after that stays in flight: that step runs the
    engine's own policy, counted as a `deadline` fallback, and the answer is
    taken at the first later step it is there, unless by then it is older
    than max_age_s (then it is dropped, counted as `deadline` too). So every
    step that asks ends in one answer (record_ok) or one fallback, and every
    call is counted once, with its latency, when it ends or is dropped."""

    def __init__(self, link: PlannerLink, max_age_s: float = PIPELINED_CALL_TIMEOUT_S) -> None:
        self.link = link
        self.max_age_s = max_age_s
        self._in_flight: _InFlight[Context] | None = None

    @property
    def in_flight(self) -> bool:
        return self._in_flight is not None

    def send(self, request: rotation_pb2.PlanRotationRequest, context: Context) -> bool:
        """Sends the snapshot for the next step; False (nothing sent) while
        an earlier call is still in flight."""
        if self._in_flight is not None:
            return False
        call = self.link.send_rotation(request, self.max_age_s)
        self._in_flight = _InFlight(call, context)
        return True

    def take(self) -> tuple[rotation_pb2.PlanRotationResponse, Context] | None:
        """At a step that wants a plan: the answer in flight and its context,
        or None (nothing in flight, or a counted fallback)."""
        sent = self._in_flight
        if sent is None:
            return None
        counters = self.link.counters
        if sent.call.age_s > self.max_age_s:
            self._in_flight = None
            sent.call.drop(counters)
            return None
        if not sent.call.wait(counters):
            counters.record_fallback(FallbackReason.DEADLINE)
            return None
        self._in_flight = None
        response = self.link.take_rotation(sent.call)
        return None if response is None else (response, sent.context)
