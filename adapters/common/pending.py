"""A planner call sent without waiting for it: pipelined planning. The engine
sends the call right after it has scheduled a step and takes the answer when
it schedules the next one, so the planner works while the model computes
and the call is off the step's critical path. A step waits only while the
call is younger than the deadline (a step shorter than the deadline); an
answer not there by then leaves that step to the engine's own policy
(counted as `deadline`) and is taken at a later step, still checked against
the engine as it is then, unless it is older than the call's time limit.

While a call is in flight the GIL switch interval is short: the thread that
sends it and takes its answer (or the in-process planner thread) needs the
GIL while the engine's thread busy-waits for the model (vLLM spins on its
worker's queue, giving the GIL back only for an instant at each turn), and
with CPython's 5 ms it gets it only after whole intervals. Measured with a
thread spinning like that, 10 ms steps, PlanRotation at 200 requests over
loopback gRPC: 16 % of answers late at 5 ms, 1-1.5 % at 0.2 ms
(docs/benchmarks.md)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from google.protobuf.message import Message

from planner.client import PlannerError

from .channel import CALL_SWITCH_INTERVAL_S, reason_of, short_gil_switch_interval
from .counters import FallbackCounters, FallbackReason


class PendingCall:
    """One call in flight. future None: it could not be sent (the planner
    thread or the sending thread is still busy with an earlier call): it is
    done, with no answer."""

    def __init__(
        self,
        send: Callable[[], Future[Message] | None],
        deadline_s: float,
        *,
        switch_interval_s: float | None = CALL_SWITCH_INTERVAL_S,
    ) -> None:
        """send starts the call (on this thread, or by handing it to
        another) and returns its future; its time counts in the call's."""
        self.deadline_s = deadline_s
        self._ended_s: float | None = None
        self._closed = False
        # Short from before the call starts; put back when the call ends (on
        # whichever thread ends it) or is taken or dropped, whichever comes
        # first.
        self._switch = contextlib.ExitStack()
        self._switch_lock = threading.Lock()
        if switch_interval_s is not None:
            self._switch.enter_context(short_gil_switch_interval(switch_interval_s))
        self.sent_s = time.perf_counter()
        self._future = send()
        if self._future is None:
            self._restore_switch()
        else:
            self._future.add_done_callback(self._ended)

    def _ended(self, _: Future[Message]) -> None:
        self._ended_s = time.perf_counter()
        self._restore_switch()

    def _restore_switch(self) -> None:
        with self._switch_lock:
            self._switch.close()

    @property
    def done(self) -> bool:
        return self._future is None or self._future.done()

    @property
    def age_s(self) -> float:
        return time.perf_counter() - self.sent_s

    def wait(self, counters: FallbackCounters) -> bool:
        """Whether the call has ended, waiting for it at most until
        deadline_s after it was sent; what the step waited is counted."""
        start = time.perf_counter()
        left_s = self.sent_s + self.deadline_s - start
        if self._future is not None and not self._future.done() and left_s > 0:
            with contextlib.suppress(FutureTimeout):
                self._future.exception(timeout=left_s)
        counters.record_wait(time.perf_counter() - start)
        return self.done

    def take(self, counters: FallbackCounters) -> Message | None:
        """The answer of an ended call, or None with the fallback counted;
        counts the call and its latency (sent to ended). The caller counts an
        answer it accepts (record_ok) or rejects."""
        if not self.done:
            raise RuntimeError("take() needs an ended call (see wait())")
        self._close()
        future = self._future
        if future is None:
            counters.record_call(0.0)
            counters.record_fallback(FallbackReason.DEADLINE)
            return None
        ended = self._ended_s if self._ended_s is not None else time.perf_counter()
        counters.record_call(ended - self.sent_s)
        error = future.exception()
        if error is not None:
            # Whatever the planner did wrong, the engine keeps running.
            counters.record_fallback(
                reason_of(error.code) if isinstance(error, PlannerError) else FallbackReason.ERROR
            )
            return None
        return future.result()

    def drop(self, counters: FallbackCounters) -> None:
        """Gives the call up (too old to be of use): counted as a call of
        its age so far that ended in a `deadline` fallback."""
        self._close()
        if self._future is not None:
            # Not started yet (queued): never run it.
            self._future.cancel()
        counters.record_call(self.age_s)
        counters.record_fallback(FallbackReason.DEADLINE)

    def _close(self) -> None:
        if self._closed:
            raise RuntimeError("a pending planner call is taken or dropped once")
        self._closed = True
        self._restore_switch()
