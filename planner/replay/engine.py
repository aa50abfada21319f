"""One simulated serving engine: iteration-level continuous batching with
chunked prefill, paged KV in GPU and CPU block pools, swaps through a link
model that overlaps with compute (what does not fit stalls the iteration).

Per iteration: arrivals join the queue; the scheduler decides; preemptions
free blocks first, then admissions and resumptions take blocks in priority
order while they fit (a resumed request's KV travels during this iteration
and it runs from the next one); running requests decode one token each and
prefilling ones take chunks of the token budget in admission order; a
request that needs a new block when none is free forces a preemption of the
most recently admitted request (by swap, or by recompute for policies that
do not swap); the iteration lasts max(compute, transfers).

Requests that cannot run are rejected on arrival (never queued, reported
unfinished), the same ones under every policy: those whose KV at the last
token (prompt plus output minus one tokens) needs more blocks than the whole
GPU pool, which could never finish, and those whose prompt does not fit with
one block to spare (the block the rotation policy reserves for the first
decode; vLLM likewise never admits a prompt over its pool less the
watermark). When an iteration does nothing at all (no token, nothing running
or being swapped in) nothing can change before the next arrival: the engine
idles until then, and after the last arrival it stops, reporting what is
left unfinished.

The requests' state lives in numpy columns (planner.replay.state), moves
between queues and pools in planner.replay.engine_state, and the batch works
on all running requests at once (planner.replay.batch). A stretch of quiet
iterations (nobody waiting, everyone decoding, nobody finishing) runs in one
step with the same results, each iteration still timed on its own; for a
scheduler that plans eager copies then (lvf), it is still asked at every
iteration and its copies made and timed as one iteration would.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from planner.domain.requests import Slo
from planner.replay.batch import form_batch
from planner.replay.engine_state import EngineState
from planner.replay.models import IterationCost, TransferCost
from planner.replay.records import ReplayResult, ReplayTotals, RequestOutcome, TimelineSample
from planner.replay.schedulers import EngineView, SchedulePlan, Scheduler
from planner.replay.state import IntArray, Phase, RequestColumns, start_candidates
from planner.trace.records import TraceRequest

# Quiet iterations run in one step at most (their block growth is worked out
# this far ahead).
_QUIET_STRETCH_MAX = 64


@dataclass(frozen=True, slots=True)
class EngineConfig:
    gpu_kv_blocks: int
    cpu_kv_blocks: int
    block_bytes: int
    block_size_tokens: int = 16
    # Chunked prefill: tokens (decode + prefill) one iteration may process.
    max_batched_tokens: int = 2048
    max_running: int = 256
    slo: Slo = field(default_factory=Slo)
    # Stop simulating this long after the last arrival even if requests remain.
    drain_limit_s: float = 3600.0
    # What a client waits beyond the engine's iterations: the serving front
    # end's HTTP, tokenization, detokenization and streaming (a measured
    # profile's request_latency_s). Each request reaches the engine this much
    # after its arrival; its latencies are still counted from the arrival.
    request_latency_s: float = 0.0
    # Seconds an iteration spends per sequence it prefills (the cost model's
    # prefill_s_per_sequence): charged on top of the cost model's time.
    prefill_s_per_sequence: float = 0.0


class Engine:
    def __init__(
        self,
        config: EngineConfig,
        scheduler: Scheduler,
        cost: IterationCost,
        link: TransferCost,
        trace: Sequence[TraceRequest],
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        self.cost = cost
        self.link = link
        self.trace = trace
        seen = _seen_by_engine(trace, config.request_latency_s)
        self.requests = RequestColumns.from_trace(seen, config.slo)
        self.state = EngineState(
            self.requests, config.gpu_kv_blocks, config.cpu_kv_blocks, config.block_size_tokens
        )
        r = self.requests
        # Rows in arrival order (ties by trace order), and which of them can
        # never run: their KV at the last token, or their prompt with one
        # block to spare, exceeds the GPU pool.
        self._arrival_order = np.argsort(r.arrival_s, kind="stable")
        self._arrivals_s = [seen[i].arrival_s for i in self._arrival_order.tolist()]
        bs = config.block_size_tokens
        most = np.maximum(
            -(-(r.prompt_tokens + r.output_tokens - 1) // bs), -(-r.prompt_tokens // bs) + 1
        )
        self._never_fits = most > config.gpu_kv_blocks
        self.now_s = 0.0
        self.timeline: list[TimelineSample] = []
        self._next_arrival = 0
        self._last_iteration_s = 0.0
        self._bytes_d2h = 0
        self._bytes_h2d = 0
        self._stall_s = 0.0
        self._peak_gpu = 0
        self._iterations = 0
        self._stop_after_s = math.inf

    # -- the loop ---------------------------------------------------------

    def run(self, progress: Callable[[float], None] | None = None) -> ReplayResult:
        started = time.perf_counter()
        arrivals = self._arrivals_s
        last_arrival = arrivals[-1] if arrivals else 0.0
        self._stop_after_s = last_arrival + self.config.drain_limit_s
        while True:
            self._arrive()
            if not self.state.active():
                if self._next_arrival >= len(arrivals):
                    break
                self.now_s = max(self.now_s, arrivals[self._next_arrival])
                continue
            if self.now_s > self._stop_after_s:
                break
            if self._quiet_stretch(progress):
                continue
            self._iteration()
            if progress is not None:
                progress(self.now_s)
            if self._stalled():
                if self._next_arrival >= len(arrivals):
                    break
                self.now_s = max(self.now_s, arrivals[self._next_arrival])
        s = self.state
        totals = ReplayTotals(
            iterations=self._iterations,
            simulated_s=self.now_s,
            wall_s=time.perf_counter() - started,
            bytes_d2h=self._bytes_d2h,
            bytes_h2d=self._bytes_h2d,
            stall_s=self._stall_s,
            preemptions=s.preemptions,
            swap_outs=s.swap_outs,
            swap_ins=s.swap_ins,
            peak_gpu_kv_blocks=self._peak_gpu,
            gpu_kv_blocks_total=self.config.gpu_kv_blocks,
        )
        return ReplayResult(
            policy=self.scheduler.name,
            requests=self._outcomes(),
            timeline=self.timeline,
            totals=totals,
        )

    def _arrive(self) -> None:
        arrivals = self._arrivals_s
        first = self._next_arrival
        if first >= len(arrivals) or arrivals[first] > self.now_s:
            return
        end = first + 1
        while end < len(arrivals) and arrivals[end] <= self.now_s:
            end += 1
        self._next_arrival = end
        rows = self._arrival_order[first:end]
        never = self._never_fits[rows]
        if never.any():
            self.state.arrive(rows[~never], rows[never])
        else:
            self.state.arrive(rows, rows[:0])

    def _stalled(self) -> bool:
        """The last iteration processed no token and left nothing running or
        being swapped in: the state cannot change until the next arrival."""
        s = self.state
        if len(s.running.rows) or len(s.in_transit.rows) or not self.timeline:
            return False
        last = self.timeline[-1]
        return last.prefill_tokens == 0 and last.decode_tokens == 0

    def _iteration(self) -> None:
        cfg = self.config
        s = self.state
        s.start_running(self.now_s)
        plan = self.scheduler.plan(
            EngineView(
                now_s=self.now_s,
                requests=self.requests,
                queued=s.queued.rows,
                running=s.running.rows,
                rotary=s.rotary.rows,
                free_gpu_blocks=s.free_gpu,
                free_cpu_blocks=s.free_cpu,
                block_size_tokens=cfg.block_size_tokens,
                last_iteration_s=self._last_iteration_s,
                max_batched_tokens=cfg.max_batched_tokens,
                free_slots=cfg.max_running - len(s.running.rows) - len(s.in_transit.rows),
            )
        )
        d2h_blocks, h2d_blocks = self._apply(plan)
        batch = form_batch(s, cfg.max_batched_tokens, self.now_s, self.scheduler.swaps)
        d2h_blocks += batch.preempted_d2h_blocks
        compute_s = self.cost.iteration_time_s(
            batch.prefill_tokens, batch.decode_tokens, batch.context_tokens
        )
        if batch.prefill_sequences:
            compute_s += cfg.prefill_s_per_sequence * batch.prefill_sequences
        d2h_bytes = d2h_blocks * cfg.block_bytes
        h2d_bytes = h2d_blocks * cfg.block_bytes
        transfer_s = (
            self.link.transfer_time_s(d2h_bytes, h2d_bytes, cfg.block_bytes)
            if d2h_bytes or h2d_bytes
            else 0.0
        )
        stall_s = max(transfer_s - compute_s, 0.0)
        self.now_s += compute_s + stall_s
        self._last_iteration_s = compute_s
        self._bytes_d2h += d2h_bytes
        self._bytes_h2d += h2d_bytes
        self._stall_s += stall_s
        self._iterations += 1
        # Peak while the batch holds its blocks, before finished requests free theirs.
        self._peak_gpu = max(self._peak_gpu, cfg.gpu_kv_blocks - s.free_gpu)
        if len(batch.emitting):
            s.emit(batch.emitting, self.now_s)
        self.timeline.append(
            TimelineSample(
                time_s=self.now_s,
                iteration_s=compute_s + stall_s,
                stall_s=stall_s,
                gpu_kv_blocks_used=cfg.gpu_kv_blocks - s.free_gpu,
                cpu_kv_blocks_used=cfg.cpu_kv_blocks - s.free_cpu,
                running=len(s.running.rows),
                waiting=len(s.queued.rows),
                rotary=len(s.rotary.rows) + len(s.in_transit.rows),
                prefill_tokens=batch.prefill_tokens,
                decode_tokens=batch.decode_tokens,
                prefill_sequences=batch.prefill_sequences,
            )
        )

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
            len(s.queued.rows)
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
        arrivals = self._arrivals_s
        next_arrival_s = (
            arrivals[self._next_arrival] if self._next_arrival < len(arrivals) else math.inf
        )
        used_before = cfg.gpu_kv_blocks - s.free_gpu
        cpu_used = cfg.cpu_kv_blocks - s.free_cpu
        # The clock and counters as locals: this loop is most of a light run.
        now_s, stalled_s, peak = self.now_s, self._stall_s, self._peak_gpu
        compute_s = 0.0
        times_s: list[float] = []
        for taken in growth:
            if times_s and (next_arrival_s <= now_s or now_s > self._stop_after_s):
                break
            context += decoding
            compute_s = self.cost.iteration_time_s(0, decoding, context)
            stall_s = max(0.0 - compute_s, 0.0)  # _iteration's, with nothing to copy
            now_s += compute_s + stall_s
            stalled_s += stall_s
            used = used_before + taken
            peak = max(peak, used)
            times_s.append(now_s)
            self.timeline.append(
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
        growth = s.quiet_growth(_QUIET_STRETCH_MAX)
        if not len(growth):
            return False
        r = self.requests
        rows = s.running.rows
        decoding = len(rows)
        kv = r.kv_tokens[rows]
        context = int(kv.sum())
        bs = cfg.block_size_tokens
        arrivals = self._arrivals_s
        next_arrival_s = (
            arrivals[self._next_arrival] if self._next_arrival < len(arrivals) else math.inf
        )
        scheduler, link, cost = self.scheduler, self.link, self.cost
        no_rows = s.queued.rows
        now_s, stalled_s, peak = self.now_s, self._stall_s, self._peak_gpu
        last_s = self._last_iteration_s
        bytes_d2h = self._bytes_d2h
        compute_s = 0.0
        times_s: list[float] = []
        eager_order: IntArray | None = None
        for _ in range(len(growth)):
            if times_s and (next_arrival_s <= now_s or now_s > self._stop_after_s):
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
            compute_s = cost.iteration_time_s(0, decoding, context)
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
            self.timeline.append(
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

    # -- carrying out a plan ------------------------------------------------

    def _apply(self, plan: SchedulePlan) -> tuple[int, int]:
        """Preempt, then start in priority order while blocks last. Returns
        blocks copied out and in."""
        s = self.state
        d2h = 0
        if len(plan.swap_out):
            d2h += s.preempt(plan.swap_out.tolist(), swap=True)
        if len(plan.recompute):
            s.preempt(plan.recompute.tolist(), swap=False)
        h2d = self._start(plan.start) if len(plan.start) else 0
        if plan.eager_blocks:
            d2h += s.eager(plan.eager_blocks)
        return d2h, h2d

    def _start(self, rows: IntArray) -> int:
        """Admit (queued) or resume (rotary) rows in order while they fit;
        returns blocks copied in. A queued request starts only when this
        iteration's token budget still has room for (part of) its prefill,
        as vLLM's scheduler admits waiting requests; otherwise it would hold
        blocks idle."""
        s = self.state
        r = self.requests
        in_order = self.scheduler.in_order
        slots = self.config.max_running - len(s.running.rows) - len(s.in_transit.rows)
        free = s.free_gpu
        if self.scheduler.running_first:
            growth = self._decode_growth_blocks()
            # The decodes will preempt: nothing is admitted this iteration.
            free = -1 if growth > free else free - growth
        prefill_room: int | None = None
        admitted: list[int] = []
        admitted_needs: list[int] = []
        resumed: list[int] = []
        resumed_needs: list[int] = []
        for row, need, was in start_candidates(r, rows):
            if slots <= 0:
                break
            if need > free:
                if in_order:
                    break
                continue
            if was == Phase.QUEUED:
                if prefill_room is None:
                    prefill_room = self._prefill_room()
                if prefill_room <= 0:
                    if in_order:
                        break
                    continue
                prefill_room -= int(r.prefill_target[row] - r.kv_tokens[row])
                admitted.append(row)
                admitted_needs.append(need)
            elif was == Phase.ROTARY:
                resumed.append(row)
                resumed_needs.append(need)
            else:
                continue
            free -= need
            slots -= 1
        if admitted:
            s.admit(admitted, admitted_needs, self.now_s)
        if resumed:
            return s.swap_in(resumed, resumed_needs, self.scheduler.keeps_cpu_copies)
        return 0

    def _decode_growth_blocks(self) -> int:
        """Blocks the running requests' decodes grow into this iteration
        (those within the token budget whose KV fills their last block), as
        form_batch takes them."""
        r = self.requests
        s = self.state
        running = s.running.rows
        kv = r.kv_tokens[running]
        decoding = (kv >= r.prefill_target[running]).nonzero()[0][: self.config.max_batched_tokens]
        full = kv[decoding] >= r.gpu_blocks[running[decoding]] * s.block_size
        return int(np.count_nonzero(full))

    def _prefill_room(self) -> int:
        """Tokens of this iteration's budget left after the running requests'
        decodes and unfinished prefills."""
        r = self.requests
        running = self.state.running.rows
        left = r.prefill_target[running] - r.kv_tokens[running]
        return self.config.max_batched_tokens - int(np.maximum(left, 1, out=left).sum())

    # -- the result ---------------------------------------------------------

    def _outcomes(self) -> list[RequestOutcome]:
        with _gc_paused():
            return self._build_outcomes()

    def _build_outcomes(self) -> list[RequestOutcome]:
        r = self.requests
        slo = self.config.slo
        return [
            RequestOutcome(
                id=id,
                arrival_s=t.arrival_s,
                prompt_tokens=t.prompt_tokens,
                output_tokens=t.output_tokens,
                slo_ttft_s=t.slo_ttft_s if t.slo_ttft_s is not None else slo.ttft_s,
                slo_tbt_s=t.slo_tbt_s if t.slo_tbt_s is not None else slo.tbt_s,
                token_times_s=times,
                finish_s=None if math.isnan(finish) else finish,
                preemptions=preemptions,
                swap_outs=swap_outs,
                swap_ins=swap_ins,
                recomputed_tokens=recomputed,
            )
            for id, t, times, finish, preemptions, swap_outs, swap_ins, recomputed in zip(
                r.ids,
                self.trace,
                self.state.tokens.per_request(r.generated),
                r.finish_s.tolist(),
                r.preemptions.tolist(),
                r.swap_outs.tolist(),
                r.swap_ins.tolist(),
                r.recomputed_tokens.tolist(),
                strict=True,
            )
        ]


def _seen_by_engine(trace: Sequence[TraceRequest], latency_s: float) -> Sequence[TraceRequest]:
    """The trace as the engine sees it: every arrival latency_s later."""
    if latency_s == 0.0:
        return trace
    if not (math.isfinite(latency_s) and latency_s > 0):
        raise ValueError(f"request_latency_s must be a finite number >= 0, got {latency_s}")
    return [replace(t, arrival_s=t.arrival_s + latency_s) for t in trace]


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
