"""An adapter's line to the planner: calls over gRPC or in process under a
tight deadline. A failed or late answer is None and counted as a fallback
(the engine then runs its own policy); planner failures never raise into
the engine. PlannerLink and OffloadLink build on it."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType
from typing import Self

import grpc
from google.protobuf.message import Message

from planner.client import PlannerClient, PlannerError, RetryPolicy
from planner.rpc import Rpc

from .counters import FallbackCounters, FallbackReason
from .security import ChannelSecurity

# Retries cannot fit in a few milliseconds (gRPC's backoff floor is 2 ms).
NO_RETRY = RetryPolicy(max_attempts=1)


class PlannerChannel:
    """target "host:port" for gRPC (security as `planner serve` was started
    with); None for in-process mode, which runs the server's own
    handler in this thread. In process a call cannot be cut short: an answer
    that comes after the deadline is dropped and counted as a deadline
    fallback, so both modes keep the same contract."""

    def __init__(
        self,
        target: str | None,
        deadline_s: float,
        retry: RetryPolicy = NO_RETRY,
        security: ChannelSecurity | None = None,
    ) -> None:
        if not deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
        security = security or ChannelSecurity()
        if target is None and security != ChannelSecurity():
            raise ValueError("TLS and a token need a target (in process there is no channel)")
        self.target = target
        self.deadline_s = deadline_s
        self._client = (
            PlannerClient(
                target,
                deadline_s=deadline_s,
                retry=retry,
                tls=security.tls,
                auth_token=security.auth_token,
            )
            if target is not None
            else None
        )
        self._local: Callable[[Rpc, Message], Message] | None = None

    @property
    def in_process(self) -> bool:
        return self._client is None

    def call(self, rpc: Rpc, request: Message, counters: FallbackCounters) -> Message | None:
        """The answer, or None with the fallback counted. The caller counts
        an answer it accepts (record_ok) or rejects (INVALID_PLAN)."""
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

    def __enter__(self) -> Self:
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


def _in_process_handler(deadline_s: float) -> Callable[[Rpc, Message], Message]:
    # The service's handler table, imported only in this mode (DESIGN.md §1:
    # adapters otherwise depend on the client and the proto alone). One
    # context for the channel's life: OffloadService keeps each engine's
    # controller in it between calls, as a server would.
    from planner.service.limits import ServiceLimits
    from planner.service.methods import CallContext, handle

    ctx = CallContext(ServiceLimits(), deadline_s)
    return lambda rpc, request: handle(rpc, request, ctx)
