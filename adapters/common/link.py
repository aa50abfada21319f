"""The adapter's line to the planner: one PlanRotation call per engine step,
over gRPC or in process, with a tight deadline. A failed, late or empty
answer is None (the engine then runs its own policy for that step) and is
counted; planner failures never raise into the engine."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType

import grpc
from google.protobuf.message import Message

from planner.client import PlannerClient, PlannerError, RetryPolicy
from planner.rpc import RPCS
from planner.v1 import rotation_pb2

from .counters import FallbackCounters, FallbackReason

DEFAULT_DEADLINE_S = 0.005
_PLAN_ROTATION = RPCS["RotationService.PlanRotation"]
# Retries cannot fit in a few milliseconds (gRPC's backoff floor is 2 ms).
NO_RETRY = RetryPolicy(max_attempts=1)


class PlannerLink:
    """target "host:port" for gRPC; None for in-process mode, which runs the
    same handler the server runs in this thread. In process the call cannot
    be cut short: an answer that comes after the deadline is dropped and
    counted as a deadline fallback, so both modes keep the same contract."""

    def __init__(
        self,
        target: str | None = None,
        deadline_s: float = DEFAULT_DEADLINE_S,
        counters: FallbackCounters | None = None,
        retry: RetryPolicy = NO_RETRY,
    ) -> None:
        if not deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
        self.target = target
        self.deadline_s = deadline_s
        self.counters = counters or FallbackCounters()
        self._client = (
            PlannerClient(target, deadline_s=deadline_s, retry=retry)
            if target is not None
            else None
        )
        self._local: Callable[[rotation_pb2.PlanRotationRequest], Message] | None = None

    @property
    def in_process(self) -> bool:
        return self._client is None

    def plan_rotation(
        self, request: rotation_pb2.PlanRotationRequest
    ) -> rotation_pb2.PlanRotationResponse | None:
        start = time.perf_counter()
        response, reason = self._ask(request)
        elapsed = time.perf_counter() - start
        self.counters.record_call(elapsed)
        if reason is None and elapsed > self.deadline_s and self.in_process:
            reason = FallbackReason.DEADLINE
        if reason is None and (response is None or not response.HasField("plan")):
            reason = FallbackReason.INVALID_PLAN
        if reason is not None:
            self.counters.record_fallback(reason)
            return None
        self.counters.record_ok()
        return response

    def _ask(
        self, request: rotation_pb2.PlanRotationRequest
    ) -> tuple[rotation_pb2.PlanRotationResponse | None, FallbackReason | None]:
        try:
            if self._client is not None:
                return self._client.plan_rotation(request), None
            if self._local is None:
                self._local = _in_process_handler(self.deadline_s)
            response = self._local(request)
            assert isinstance(response, rotation_pb2.PlanRotationResponse)
            return response, None
        except PlannerError as exc:
            return None, _reason(exc.code)
        except Exception:
            # Whatever the planner does wrong, the engine keeps running.
            return None, FallbackReason.ERROR

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def __enter__(self) -> PlannerLink:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _reason(code: grpc.StatusCode) -> FallbackReason:
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return FallbackReason.DEADLINE
    if code == grpc.StatusCode.UNAVAILABLE:
        return FallbackReason.UNAVAILABLE
    return FallbackReason.ERROR


def _in_process_handler(
    deadline_s: float,
) -> Callable[[rotation_pb2.PlanRotationRequest], Message]:
    # The service's handler table, imported only in this mode (DESIGN.md §1:
    # adapters otherwise depend on the client and the proto alone).
    from planner.service.limits import ServiceLimits
    from planner.service.methods import CallContext, handle

    ctx = CallContext(ServiceLimits(), deadline_s)
    return lambda request: handle(_PLAN_ROTATION, request, ctx)
