"""The single-engine topology: one batching core (planner.replay.
batching_core: continuous batching with chunked prefill, paged KV in GPU and
CPU block pools, swaps through a link model, preemption by swap or
recompute) fed the trace's arrivals and run on the replay's event loop
(planner.replay.events, with the events of planner.replay.engine_events:
arrivals due, the engine iterating, the drain limit); before each
iteration, the arrivals up to its start join the queue.

Requests that cannot run are rejected on arrival (never queued, reported
unfinished), the same ones under every policy: those whose KV at the last
token (prompt plus output minus one tokens) needs more blocks than the whole
GPU pool, which could never finish, and those whose prompt does not fit with
one block to spare (the block the rotation policy reserves for the first
decode; vLLM likewise never admits a prompt over its pool less the
watermark). When an iteration does nothing at all (no token, no preemption,
nothing running or being swapped in) nothing can change before the next
arrival: the engine idles until then, and after the last arrival it stops,
reporting what is left unfinished.

A stretch of quiet iterations (nobody waiting, everyone decoding, nobody
finishing) runs in one step with the same results, each iteration still
timed on its own; for a scheduler that plans eager copies then (lvf), it is
still asked at every iteration and its copies made and timed as one
iteration would.
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from planner.replay.batching_core import (
    BatchingCore,
    EngineConfig,
    never_fits,
    request_outcomes,
)
from planner.replay.engine_events import ArrivalsDue, DrainLimit, EngineIterates, EngineWiring
from planner.replay.events import EventLoop
from planner.replay.kv_residency import KvResidency
from planner.replay.models import AttentionPairsCost, IterationCost, TransferCost
from planner.replay.prefix_cache import PrefixCache
from planner.replay.records import ReplayResult, ReplayTotals, RequestOutcome, TimelineSample
from planner.replay.schedulers import EngineView, Scheduler
from planner.replay.state import IntArray, RequestColumns
from planner.trace.records import TraceRequest

__all__ = ["Engine", "EngineConfig"]

# Quiet iterations run in one step at most (their block growth is worked out
# this far ahead).
_QUIET_STRETCH_MAX = 64


class Engine(BatchingCore):
    """The single-engine topology: one batching core fed the trace's
    arrivals, run on the event loop (the EngineWiring of engine_events)."""

    def __init__(
        self,
        config: EngineConfig,
        scheduler: Scheduler,
        cost: IterationCost,
        link: TransferCost | None,
        trace: Sequence[TraceRequest],
        *,
        admitted_s: Sequence[float] | None = None,
        pairs_cost: AttentionPairsCost | None = None,
        residency: KvResidency | None = None,
        rejects: npt.NDArray[np.bool_] | None = None,
    ) -> None:
        """admitted_s: when each request of the trace leaves the front end and
        reaches the engine (run_through_front_end's passes); None: after the
        request latency and the admission queue of the config alone.
        pairs_cost and residency: as BatchingCore's; rejects: which requests
        are rejected on arrival (by default never_fits)."""
        self.trace = trace
        seen = _seen_by_engine(trace, config.request_latency_s, config.admission_s_per_request)
        if admitted_s is not None:
            seen = [replace(t, arrival_s=at) for t, at in zip(trace, admitted_s, strict=True)]
        requests = RequestColumns.from_trace(seen, config.slo)
        prefix = (
            PrefixCache(
                [t.prefix_block_ids for t in seen],
                requests.prompt_tokens,
                config.gpu_kv_blocks,
                config.block_size_tokens,
                config.prefix_block_tokens,
            )
            if config.prefix_cache
            else None
        )
        super().__init__(
            config,
            scheduler,
            cost,
            link,
            requests,
            prefix=prefix,
            pairs_cost=pairs_cost,
            residency=residency,
        )
        r = self.requests
        # Rows in arrival order (ties by trace order), and which of them can
        # never run: their KV at the last token, or their prompt with one
        # block to spare, exceeds the GPU pool.
        self._arrival_order = np.argsort(r.arrival_s, kind="stable")
        self._arrivals_s = [seen[i].arrival_s for i in self._arrival_order.tolist()]
        never = (
            rejects
            if rejects is not None
            else never_fits(r, config.gpu_kv_blocks, config.block_size_tokens)
        )
        self._never_fits = never if never.any() else None
        self._no_rows = self._arrival_order[:0]
        self._next_arrival = 0
        self._events: EventLoop[EngineWiring] = EventLoop()
        self._iterating = False
        self._ended = False
        self._progress: Callable[[float], None] | None = None
        # While the clock is below this, iterations run in place (see iterate).
        self._in_place_before_s = math.inf

    # -- the loop ---------------------------------------------------------

    def run(self, progress: Callable[[float], None] | None = None) -> ReplayResult:
        started = time.perf_counter()
        self.drive(progress)
        totals = self.totals(time.perf_counter() - started)
        return ReplayResult(
            policy=self.scheduler.name,
            requests=self._outcomes(),
            timeline=self.timeline,
            totals=totals,
        )

    def totals(self, wall_s: float) -> ReplayTotals:
        """The run's totals so far, wall_s being its wall time."""
        s = self.state
        return ReplayTotals(
            iterations=self._iterations,
            simulated_s=self.now_s,
            wall_s=wall_s,
            bytes_d2h=self._bytes_d2h,
            bytes_h2d=self._bytes_h2d,
            stall_s=self._stall_s,
            preemptions=s.preemptions,
            swap_outs=s.swap_outs,
            swap_ins=s.swap_ins,
            peak_gpu_kv_blocks=self._peak_gpu,
            gpu_kv_blocks_total=self.config.gpu_kv_blocks,
            prefix_queried_tokens=self.prefix.queried_tokens if self.prefix else 0,
            prefix_hit_tokens=self.prefix.hit_tokens if self.prefix else 0,
        )

    def drive(self, progress: Callable[[float], None] | None = None) -> None:
        """Runs the trace to its end (or the drain limit) on the event loop
        (planner.replay.engine_events): arrivals join the queue, the core
        iterates, idle stretches are skipped."""
        arrivals = self._arrivals_s
        self._progress = progress
        self._iterating = False
        self._ended = False
        if arrivals:
            events = self._events
            events.push(ArrivalsDue(arrivals[0]))
            events.push(DrainLimit(arrivals[-1] + self.config.drain_limit_s))
            events.run(self, self._has_ended)
        self._progress = None

    def _has_ended(self) -> bool:
        return self._ended

    # -- the events (planner.replay.engine_events) ----------------------------

    def arrive(self, now_s: float) -> None:
        if not self._iterating:
            self.now_s = max(self.now_s, now_s)
        self._arrive()
        arrivals = self._arrivals_s
        events = self._events
        if self._next_arrival < len(arrivals):
            events.push(ArrivalsDue(arrivals[self._next_arrival]))
        if not self._iterating:
            # The engine starts again: its EngineIterates, in place when it
            # would be the next event anyway.
            self._iterating = True
            before_s = events.in_place_before_s(EngineIterates.priority)
            if self.now_s < before_s:
                self._run(before_s)
            else:
                events.push(EngineIterates(self.now_s))

    def iterate(self, now_s: float) -> None:
        self._run(self._events.in_place_before_s(EngineIterates.priority))

    def _run(self, before_s: float) -> None:
        """Iterations from the engine's clock, in place (quiet stretches in
        one step) while the next would start before before_s, when another
        event comes first; then that EngineIterates is queued, unless the
        event is the arrivals that came during the last iteration (their
        handler runs the engine again). An engine with nothing to do, or
        whose last iteration did nothing (_stalled), queues none and waits
        for the next arrival."""
        self._in_place_before_s = before_s
        state = self.state
        progress = self._progress
        while True:
            if not state.active():
                self._iterating = False
                return
            if not self._quiet_stretch(progress):
                preemptions = state.preemptions
                self._iteration()
                if progress is not None:
                    progress(self.now_s)
                if self._stalled(preempted=state.preemptions > preemptions):
                    self._iterating = False
                    return
            if self.now_s >= before_s:
                break
        arrivals = self._arrivals_s
        if self._next_arrival < len(arrivals) and arrivals[self._next_arrival] <= self.now_s:
            self._iterating = False
        else:
            self._events.push(EngineIterates(self.now_s))

    def end(self, now_s: float) -> None:
        """The drain limit: what is left stays unfinished."""
        self._ended = True

    def _arrive(self) -> None:
        """The arrivals up to the clock join the queue (or are rejected)."""
        arrivals = self._arrivals_s
        first = self._next_arrival
        if first >= len(arrivals) or arrivals[first] > self.now_s:
            return
        end = first + 1
        while end < len(arrivals) and arrivals[end] <= self.now_s:
            end += 1
        self._next_arrival = end
        rows = self._arrival_order[first:end]
        if self._never_fits is not None:
            never = self._never_fits[rows]
            if never.any():
                self.state.arrive(rows[~never], rows[never])
                return
        self.state.arrive(rows, self._no_rows)

    def _stalled(self, preempted: bool) -> bool:
        """The last iteration processed no token, preempted nobody and left
        nothing running or being swapped in: the state cannot change until
        the next arrival. (A preemption frees blocks that the next plan may
        start someone in.)"""
        s = self.state
        if preempted or len(s.running.rows) or len(s.in_transit.rows) or not self.timeline:
            return False
        last = self.timeline[-1]
        return last.prefill_tokens == 0 and last.decode_tokens == 0

    def _quiet_stretch(self, progress: Callable[[float], None] | None) -> bool:
        """Runs the iterations ahead in one step while they are quiet: nobody
        is queued, rotary or being swapped in (so a scheduler idle unless
        someone waits has nothing to say), every running request decodes and
        none finishes, and the blocks they grow into are free. Each
        iteration's time is still worked out on its own, and the stretch ends
        before an arrival or past the drain limit. False when the next
        iteration is not quiet."""
        s = self.state
        cfg = self.config
        if (
            self.residency is not None
            or len(s.queued.rows)
            or len(s.rotary.rows)
            or len(s.in_transit.rows)
            or len(s.running.rows) > cfg.max_batched_tokens
        ):
            return False
        if not self.scheduler.idle_unless_waiting:
            if self.scheduler.copies_only_unless_waiting:
                return self._copying_stretch(progress)
            return False
        growth = s.quiet_growth(_QUIET_STRETCH_MAX).tolist()
        if not growth:
            return False
        decoding = len(s.running)
        context = int(self.requests.kv_tokens[s.running.rows].sum())
        before_s = self._in_place_before_s
        used_before = cfg.gpu_kv_blocks - s.free_gpu
        cpu_used = cfg.cpu_kv_blocks - s.free_cpu
        # The clock, counters and methods as locals: this loop is most of a
        # light run.
        now_s, stalled_s, peak = self.now_s, self._stall_s, self._peak_gpu
        iteration_time_s, record = self.cost.iteration_time_s, self.timeline.append
        compute_s = 0.0
        times_s: list[float] = []
        for taken in growth:
            if times_s and now_s >= before_s:
                break
            context += decoding
            compute_s = iteration_time_s(0, decoding, context)
            stall_s = max(0.0 - compute_s, 0.0)  # _iteration's, with nothing to copy
            now_s += compute_s + stall_s
            stalled_s += stall_s
            used = used_before + taken
            peak = max(peak, used)
            times_s.append(now_s)
            record(
                TimelineSample(
                    time_s=now_s,
                    iteration_s=compute_s + stall_s,
                    stall_s=stall_s,
                    gpu_kv_blocks_used=used,
                    cpu_kv_blocks_used=cpu_used,
                    running=decoding,
                    waiting=0,
                    rotary=0,
                    prefill_tokens=0,
                    decode_tokens=decoding,
                )
            )
            if progress is not None:
                progress(now_s)
        self.now_s, self._stall_s, self._peak_gpu = now_s, stalled_s, peak
        self._last_iteration_s = compute_s
        self._iterations += len(times_s)
        s.decode_quietly(times_s)
        return True

    def _copying_stretch(self, progress: Callable[[float], None] | None) -> bool:
        """A quiet stretch (see _quiet_stretch) for a scheduler that plans at
        most eager copies while nobody waits: it is asked at every iteration,
        on the state that iteration would see, and its copies are made and
        timed as _iteration makes and times them; the decodes (the batch of
        every running request) grow KV and blocks as form_batch would, and
        the tokens are recorded at the end."""
        s = self.state
        cfg = self.config
        link = self.link
        if link is None:
            # No copies without a link: _iteration says so.
            return False
        growth = s.quiet_growth(_QUIET_STRETCH_MAX)
        if not len(growth):
            return False
        r = self.requests
        rows = s.running.rows
        decoding = len(rows)
        kv = r.kv_tokens[rows]
        context = int(kv.sum())
        bs = cfg.block_size_tokens
        before_s = self._in_place_before_s
        scheduler = self.scheduler
        iteration_time_s, record = self.cost.iteration_time_s, self.timeline.append
        no_rows = s.queued.rows
        now_s, stalled_s, peak = self.now_s, self._stall_s, self._peak_gpu
        last_s = self._last_iteration_s
        bytes_d2h = self._bytes_d2h
        compute_s = 0.0
        times_s: list[float] = []
        eager_order: IntArray | None = None
        for _ in range(len(growth)):
            if times_s and now_s >= before_s:
                break
            plan = scheduler.plan(
                EngineView(
                    now_s=now_s,
                    requests=r,
                    queued=no_rows,
                    running=rows,
                    rotary=no_rows,
                    free_gpu_blocks=s.free_gpu,
                    free_cpu_blocks=s.free_cpu,
                    block_size_tokens=bs,
                    last_iteration_s=last_s,
                    max_batched_tokens=cfg.max_batched_tokens,
                    free_slots=cfg.max_running - decoding,
                    prefix=self.prefix,
                )
            )
            if len(plan.swap_out) or len(plan.recompute) or len(plan.start):
                raise RuntimeError(
                    f"{scheduler.name}: a plan beyond eager copies while nobody waits"
                )
            d2h_blocks = 0
            if plan.eager_blocks:
                # Nobody starts or stops running in a stretch: one order.
                if eager_order is None:
                    eager_order = s.eager_order()
                d2h_blocks = s.eager(plan.eager_blocks, eager_order)
            # form_batch's decodes: a request whose KV fills its blocks takes
            # one more (quiet_growth made sure they are free).
            gpu = r.gpu_blocks[rows]
            growing = kv >= gpu * bs
            grown = int(np.count_nonzero(growing))
            if grown:
                r.gpu_blocks[rows] = gpu + growing
                s.free_gpu -= grown
            kv = kv + 1
            r.kv_tokens[rows] = kv
            context += decoding
            compute_s = iteration_time_s(0, decoding, context)
            d2h_bytes = d2h_blocks * cfg.block_bytes
            transfer_s = link.transfer_time_s(d2h_bytes, 0, cfg.block_bytes) if d2h_bytes else 0.0
            stall_s = max(transfer_s - compute_s, 0.0)
            now_s += compute_s + stall_s
            last_s = compute_s
            bytes_d2h += d2h_bytes
            stalled_s += stall_s
            used = cfg.gpu_kv_blocks - s.free_gpu
            peak = max(peak, used)
            times_s.append(now_s)
            record(
                TimelineSample(
                    time_s=now_s,
                    iteration_s=compute_s + stall_s,
                    stall_s=stall_s,
                    gpu_kv_blocks_used=used,
                    cpu_kv_blocks_used=cfg.cpu_kv_blocks - s.free_cpu,
                    running=decoding,
                    waiting=0,
                    rotary=0,
                    prefill_tokens=0,
                    decode_tokens=decoding,
                )
            )
            if progress is not None:
                progress(now_s)
        self.now_s, self._stall_s, self._peak_gpu = now_s, stalled_s, peak
        self._bytes_d2h = bytes_d2h
        self._last_iteration_s = compute_s
        self._iterations += len(times_s)
        s.emit_quietly(times_s)
        return True

    # -- the result ---------------------------------------------------------

    def _outcomes(self) -> list[RequestOutcome]:
        with _gc_paused():
            return self._build_outcomes()

    def _build_outcomes(self) -> list[RequestOutcome]:
        return request_outcomes(
            self.requests,
            self.trace,
            self.state.tokens,
            self.config.slo,
            np.maximum(self.prefix.first_hit_tokens, 0).tolist() if self.prefix else None,
        )


def _seen_by_engine(
    trace: Sequence[TraceRequest], latency_s: float, admission_s: float = 0.0
) -> Sequence[TraceRequest]:
    """The trace as the engine sees it: every arrival latency_s later, then
    through the admission queue (admission_s_per_request): one request at a
    time in arrival order (ties in trace order), each leaving it admission_s
    after it entered or after the one before left, whichever is later."""
    if latency_s == 0.0 and admission_s == 0.0:
        return trace
    for name, value in (("request_latency_s", latency_s), ("admission_s_per_request", admission_s)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    if admission_s == 0.0:
        return [replace(t, arrival_s=t.arrival_s + latency_s) for t in trace]
    seen_s = admission_exits_s([t.arrival_s + latency_s for t in trace], admission_s)
    return [replace(t, arrival_s=at) for t, at in zip(trace, seen_s, strict=True)]


def admission_exits_s(entries_s: Sequence[float], service_s: float) -> list[float]:
    """When each request leaves a first-come-first-served queue with one
    server that takes service_s per request, given when each entered (ties
    served in the given order)."""
    order = sorted(range(len(entries_s)), key=entries_s.__getitem__)
    exits = [0.0] * len(entries_s)
    free_s = -math.inf
    for i in order:
        free_s = max(entries_s[i], free_s) + service_s
        exits[i] = free_s
    return exits


# What a front end's one server does, in this order at equal times.
_ADMIT, _TOKENIZE, _STREAM = 0, 1, 2


def front_end_passage_s(
    entries_s: Sequence[float],
    admission_s: float,
    token_times_s: Sequence[float],
    stream_s: float,
    step_s: float = 0.0,
    *,
    prompt_tokens: Sequence[int] = (),
    tokenize_s_per_token: float = 0.0,
) -> tuple[list[float], list[float]]:
    """When each request is taken up by, and when it leaves, a front end with
    one server that serves, in the order they come, admissions (admission_s
    each, entered at entries_s) and streamed output tokens (stream_s each, at
    token_times_s; the tokens of one time are one engine step's output, which
    takes step_s more); at equal times admissions first, and among them the
    given order. A request is taken up when its admission is done; with
    tokenize_s_per_token > 0 it then goes back in line for its tokenization
    (its prompt_tokens times that), behind whatever came in meanwhile, and
    leaves when that is done; otherwise it leaves when taken up."""
    if tokenize_s_per_token > 0 and len(prompt_tokens) != len(entries_s):
        raise ValueError("prompt_tokens: one per request when tokenize_s_per_token > 0")
    if step_s == 0.0:
        work = [(t, _STREAM, -1, stream_s) for t in token_times_s]
    else:
        per_step = Counter(token_times_s)
        work = [(t, _STREAM, -1, step_s + n * stream_s) for t, n in per_step.items()]
    events = [(t, _ADMIT, i, admission_s) for i, t in enumerate(entries_s)] + work
    heapq.heapify(events)
    taken_up = [0.0] * len(entries_s)
    exits = [0.0] * len(entries_s)
    free_s = -math.inf
    while events:
        at, kind, i, service_s = heapq.heappop(events)
        free_s = max(at, free_s) + service_s
        if kind == _ADMIT:
            taken_up[i] = free_s
            if tokenize_s_per_token > 0:
                heapq.heappush(
                    events, (free_s, _TOKENIZE, i, tokenize_s_per_token * prompt_tokens[i])
                )
            else:
                exits[i] = free_s
        elif kind == _TOKENIZE:
            exits[i] = free_s
    return taken_up, exits


# The front end's passes: a replay of the engine gives the tokens streamed,
# the tokens give when each request passes the front end, and that the next
# replay's arrivals; the passes stop when the arrivals stay within
# FRONT_END_TOLERANCE_S of the last pass's (a fixed point), or after
# FRONT_END_PASSES.
FRONT_END_PASSES = 16
FRONT_END_TOLERANCE_S = 1e-6


def has_front_end(config: EngineConfig) -> bool:
    """Whether the config's front end needs run_through_front_end's passes
    (streaming work, or tokenization after the admission)."""
    return (
        config.stream_s_per_token > 0
        or config.stream_s_per_step > 0
        or config.tokenize_s_per_prompt_token > 0
    )


def run_through_front_end(
    config: EngineConfig,
    trace: Sequence[TraceRequest],
    make_engine: Callable[[Sequence[float] | None], Engine],
    progress: Callable[[float], None] | None = None,
) -> tuple[ReplayResult, int, float]:
    """A replay of the trace with the config's front end (admissions, the
    streaming of output tokens and the tokenization after an admission on
    one server: has_front_end): the result of the last pass, the passes run,
    and the largest change of an arrival at the engine between the last two
    (0: a fixed point). Without such work, one plain pass."""
    result = make_engine(None).run(progress)
    if not has_front_end(config) or not trace:
        return result, 1, 0.0
    entries_s = [t.arrival_s + config.request_latency_s for t in trace]
    prompt_tokens = [t.prompt_tokens for t in trace]
    used_s = admission_exits_s(entries_s, config.admission_s_per_request)
    change_s = math.inf
    passes = 1
    while True:
        tokens_s = [t for r in result.requests for t in r.token_times_s]
        _, exits_s = front_end_passage_s(
            entries_s,
            config.admission_s_per_request,
            tokens_s,
            config.stream_s_per_token,
            config.stream_s_per_step,
            prompt_tokens=prompt_tokens,
            tokenize_s_per_token=config.tokenize_s_per_prompt_token,
        )
        change_s = max(abs(a - b) for a, b in zip(exits_s, used_s, strict=True))
        if change_s <= FRONT_END_TOLERANCE_S or passes >= FRONT_END_PASSES:
            return result, passes, change_s
        used_s = exits_s
        result = make_engine(exits_s).run(progress)
        passes += 1


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """The outcomes hold every token time (millions, in acyclic lists): a
    garbage collection while they are built would only walk them."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
