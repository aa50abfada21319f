"""An adapter's line to the planner: calls over gRPC or in process under a
tight deadline. A failed or late answer is None and counted as a fallback
(the engine then runs its own policy); planner failures never raise into
the engine. PlannerLink and OffloadLink build on it."""

from __future__ import annotations

import importlib
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Literal, Self

import grpc
from google.protobuf.message import Message

from planner.call_timing import CallTiming, ServerTiming
from planner.client import PlannerClient, PlannerError, RetryPolicy
from planner.rpc import Rpc

from .counters import FallbackCounters, FallbackReason
from .security import ChannelSecurity

# Retries cannot fit in a few milliseconds (gRPC's backoff floor is 2 ms).
NO_RETRY = RetryPolicy(max_attempts=1)
# CPython's GIL switch interval while a call waits. An engine's other Python
# threads (vLLM's output and input socket threads, an in-process planner)
# may hold the GIL when the answer arrives; the waiting thread gets it back
# only after the switch interval, 5 ms by default: the whole budget.
# Measured with one busy Python thread beside the caller, PlanRotation over
# loopback at 100 requests: 66 % of calls over 5 ms at 5 ms, 6 % at 0.2 ms
# (docs/adapters.md). Set only for the call, then put back.
CALL_SWITCH_INTERVAL_S = 0.0002
# The in-process shim's handler table (planner/in_process): loaded by name on
# the planner thread, and only when the planner runs in process, so that an
# engine using a planner server does not load the service, its policies and
# solvers (about 2 s and 240 MB).
IN_PROCESS_SERVICE = "planner.in_process.service"
# How a pipelined call goes out over gRPC: "sender-thread" hands it to a
# thread of the adapter's that waits for the answer; "grpc-future" starts it
# on the engine's own thread (gRPC's future API) and gRPC's completion
# thread ends it. Measured at 200 requests on loopback (docs/benchmarks.md):
# starting a call through gRPC's future held the caller 0.8-1.9 ms (p50)
# and up to 9 ms (p99), handing it over 0.03-0.06 ms, and more of its calls
# passed 5 ms; so the sending thread is the default.
PipelinedSend = Literal["grpc-future", "sender-thread"]
PIPELINED_SENDS: tuple[PipelinedSend, ...] = ("grpc-future", "sender-thread")


class PlannerChannel:
    """target "host:port" for gRPC (security as `planner serve` was started
    with), or several planner replicas ("host1:port,host2:port", or a list):
    calls are balanced across them, and OffloadService and the serverless
    knob tuner's calls keep to their engine's (GPU's) replica (see
    planner.client); None for in-process mode, which runs the server's own
    handler on a planner thread of its own (InProcessPlanner): the caller
    waits at most the deadline, as it would for a remote planner."""

    def __init__(
        self,
        target: str | Sequence[str] | None,
        deadline_s: float,
        retry: RetryPolicy = NO_RETRY,
        security: ChannelSecurity | None = None,
        *,
        switch_interval_s: float | None = CALL_SWITCH_INTERVAL_S,
        pipelined_send: PipelinedSend = "sender-thread",
        call_timing_log: str | None = None,
    ) -> None:
        """switch_interval_s: the GIL switch interval while a call waits
        (None: CPython's, untouched); pipelined_send: how send() starts a
        call over gRPC; call_timing_log: a file that gets each gRPC call's
        moments, the caller's and the server's (planner.call_timing), one
        JSON line per call (synchronous calls and pipelined ones through the
        sending thread; a measurement aid: the line is written on the
        calling thread after the answer)."""
        if not deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
        security = security or ChannelSecurity()
        if target is None and security != ChannelSecurity():
            raise ValueError("TLS and a token need a target (in process there is no channel)")
        self.target = target if target is None or isinstance(target, str) else ",".join(target)
        self.deadline_s = deadline_s
        self.switch_interval_s = switch_interval_s
        if pipelined_send not in PIPELINED_SENDS:
            raise ValueError(
                f"pipelined_send must be grpc-future or sender-thread, got {pipelined_send!r}"
            )
        self.pipelined_send = pipelined_send
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
        if call_timing_log is not None and target is None:
            raise ValueError("call_timing_log needs a target (in process there is no server)")
        self._timing_log = (
            open(call_timing_log, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
            if call_timing_log is not None
            else None
        )
        self._local = InProcessPlanner(deadline_s) if target is None else None
        # Pipelined calls over gRPC: one sending thread, one call in flight.
        self._sender: ThreadPoolExecutor | None = None
        self._sent: Future[Message] | None = None

    @property
    def in_process(self) -> bool:
        return self._client is None

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Whether the in-process planner thread is free (its handler loaded,
        its last call finished) within timeout_s; True at once over gRPC."""
        return self._local is None or self._local.wait_idle(timeout_s)

    def call(self, rpc: Rpc, request: Message, counters: FallbackCounters) -> Message | None:
        """The answer, or None with the fallback counted. The caller counts
        an answer it accepts (record_ok) or rejects (INVALID_PLAN)."""
        start = time.perf_counter()
        if self.switch_interval_s is None:
            response, reason = self._ask(rpc, request)
        else:
            with short_gil_switch_interval(self.switch_interval_s):
                response, reason = self._ask(rpc, request)
        elapsed = time.perf_counter() - start
        counters.record_call(elapsed)
        counters.record_wait(elapsed)
        if reason is not None:
            counters.record_fallback(reason)
            return None
        return response

    def send(self, rpc: Rpc, request: Message, timeout_s: float) -> Future[Message] | None:
        """Sends a call without waiting for it (pipelined planning): the
        future ends with the answer or the planner's error (PlannerError
        over gRPC). None while an earlier sent call is still running: one
        call in flight at a time. Over gRPC the call is cut after timeout_s;
        in process the planner thread finishes it whatever it takes."""
        if self._local is not None:
            return self._local.send(rpc, request)
        if self._sent is not None and not self._sent.done():
            return None
        assert self._client is not None
        if self.pipelined_send == "grpc-future":
            try:
                self._sent = self._client.call_future(rpc, request, timeout_s)
            except Exception as exc:
                # Whatever the channel does wrong, the engine keeps running.
                failed: Future[Message] = Future()
                failed.set_exception(exc)
                self._sent = failed
            return self._sent
        if self._sender is None:
            self._sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="planner-send")
        if self._timing_log is None:
            self._sent = self._sender.submit(self._client.call, rpc, request, timeout_s)
        else:
            self._sent = self._sender.submit(
                self._timed_call, rpc, request, timeout_s, time.perf_counter_ns()
            )
        return self._sent

    def _timed_call(
        self, rpc: Rpc, request: Message, timeout_s: float | None, handed_ns: int
    ) -> Message:
        """client.call, with the call's moments written to the timing log."""
        assert self._client is not None and self._timing_log is not None
        picked_ns = time.perf_counter_ns()
        server: ServerTiming | None = None
        code = "OK"
        try:
            response, server = self._client.call_timed(rpc, request, timeout_s)
        except PlannerError as exc:
            code = exc.code.name
            raise
        finally:
            timing = CallTiming(handed_ns, picked_ns, time.perf_counter_ns(), server, code)
            self._timing_log.write(json.dumps(timing.to_json()) + "\n")
        return response

    def _ask(self, rpc: Rpc, request: Message) -> tuple[Message | None, FallbackReason | None]:
        try:
            if self._client is not None:
                if self._timing_log is not None:
                    now_ns = time.perf_counter_ns()
                    return self._timed_call(rpc, request, None, now_ns), None
                return self._client.call(rpc, request), None
            assert self._local is not None
            return self._local.call(rpc, request)
        except PlannerError as exc:
            return None, reason_of(exc.code)
        except Exception:
            # Whatever the planner does wrong, the engine keeps running.
            return None, FallbackReason.ERROR

    def close(self) -> None:
        if self._sender is not None:
            self._sender.shutdown(wait=False, cancel_futures=True)
        if self._client is not None:
            self._client.close()
        if self._local is not None:
            self._local.close()
        if self._timing_log is not None:
            self._timing_log.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@contextmanager
def short_gil_switch_interval(interval_s: float = CALL_SWITCH_INTERVAL_S) -> Iterator[None]:
    """The GIL switch interval at most interval_s inside the block; the
    previous one after it (unless something else changed it meanwhile)."""
    previous = sys.getswitchinterval()
    if previous <= interval_s:
        yield
        return
    sys.setswitchinterval(interval_s)
    try:
        yield
    finally:
        if sys.getswitchinterval() == interval_s:
            sys.setswitchinterval(previous)


def reason_of(code: grpc.StatusCode) -> FallbackReason:
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return FallbackReason.DEADLINE
    if code == grpc.StatusCode.UNAVAILABLE:
        return FallbackReason.UNAVAILABLE
    return FallbackReason.ERROR


class InProcessPlanner:
    """The server's own handler table on one planner thread. call() waits
    for the answer at most the deadline; a late answer is dropped (the
    thread finishes it and is free again), and while the thread is still
    busy with an earlier call, a new one falls back at once instead of
    queueing behind it. The handler (planner.in_process.service) is loaded
    and made on the thread as soon as the planner is, so the engine's first
    step does not wait for it (it falls back while the thread is busy).

    The planner thread shares the engine process's GIL: its pure-Python
    parts slow the engine's thread while they run, even after the deadline.
    A planner server on its own process (target) does not."""

    def __init__(self, deadline_s: float) -> None:
        self.deadline_s = deadline_s
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="planner-in-process")
        self._handler: Callable[[Rpc, Message], Message] | None = None
        self._last: Future[Any] = self._pool.submit(self._load)

    def _load(self) -> None:
        shim = importlib.import_module(IN_PROCESS_SERVICE)
        self._handler = shim.service_handler(self.deadline_s)

    def _run(self, rpc: Rpc, request: Message) -> Message:
        assert self._handler is not None
        return self._handler(rpc, request)

    @property
    def busy(self) -> bool:
        return not self._last.done()

    def call(self, rpc: Rpc, request: Message) -> tuple[Message | None, FallbackReason | None]:
        """The answer, or the reason there is none (DEADLINE: late or busy).
        What the handler raises, this raises."""
        if self.busy:
            return None, FallbackReason.DEADLINE
        if self._handler is None:
            # Loading failed: the error says why.
            self._last.result()
        start = time.perf_counter()
        future = self._pool.submit(self._run, rpc, request)
        self._last = future
        try:
            response = future.result(timeout=self.deadline_s)
        except FutureTimeout:
            return None, FallbackReason.DEADLINE
        # The waiting thread gets the GIL back only between the planner
        # thread's switch intervals: an answer may be ready but late.
        if time.perf_counter() - start > self.deadline_s:
            return None, FallbackReason.DEADLINE
        return response, None

    def send(self, rpc: Rpc, request: Message) -> Future[Message] | None:
        """Starts a call on the planner thread without waiting for it; None
        while the thread is still busy with an earlier call. The future ends
        with the answer or what the handler raised (or why loading failed)."""
        if self.busy:
            return None
        if self._handler is None:
            failed: Future[Message] = self._last
            return failed
        future = self._pool.submit(self._run, rpc, request)
        self._last = future
        return future

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Whether the planner thread finished its last call within timeout_s."""
        try:
            self._last.exception(timeout=timeout_s)
        except FutureTimeout:
            return False
        return True

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
