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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from planner.domain.requests import Slo
from planner.replay.models import IterationCost, TransferCost
from planner.replay.records import ReplayResult, ReplayTotals, TimelineSample
from planner.replay.schedulers import EngineView, SchedulePlan, Scheduler, blocks_needed
from planner.replay.state import Phase, SimRequest
from planner.trace.records import TraceRequest


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
        slo = config.slo
        self.requests = [
            SimRequest(
                i,
                t.id if t.id is not None else f"r{i}",
                arrival_s=t.arrival_s,
                prompt_tokens=t.prompt_tokens,
                output_tokens=t.output_tokens,
                slo_ttft_s=t.slo_ttft_s if t.slo_ttft_s is not None else slo.ttft_s,
                slo_tbt_s=t.slo_tbt_s if t.slo_tbt_s is not None else slo.tbt_s,
            )
            for i, t in enumerate(trace)
        ]
        self.requests.sort(key=lambda r: (r.arrival_s, r.index))
        self.queued: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.rotary: list[SimRequest] = []
        self.in_transit: list[SimRequest] = []
        self.free_gpu = config.gpu_kv_blocks
        self.free_cpu = config.cpu_kv_blocks
        self.now_s = 0.0
        self.timeline: list[TimelineSample] = []
        self._next_arrival = 0
        self._last_iteration_s = 0.0
        self._bytes_d2h = 0
        self._bytes_h2d = 0
        self._stall_s = 0.0
        self._preemptions = 0
        self._swap_outs = 0
        self._swap_ins = 0
        self._peak_gpu = 0
        self._iterations = 0
        self._preempted_blocks = 0

    # -- the loop ---------------------------------------------------------

    def run(self, progress: Callable[[float], None] | None = None) -> ReplayResult:
        started = time.perf_counter()
        last_arrival = self.requests[-1].arrival_s if self.requests else 0.0
        while True:
            self._arrive()
            if not (self.queued or self.running or self.rotary or self.in_transit):
                if self._next_arrival >= len(self.requests):
                    break
                self.now_s = max(self.now_s, self.requests[self._next_arrival].arrival_s)
                continue
            if self.now_s > last_arrival + self.config.drain_limit_s:
                break
            self._iteration()
            if progress is not None:
                progress(self.now_s)
            if self._stalled():
                if self._next_arrival >= len(self.requests):
                    break
                self.now_s = max(self.now_s, self.requests[self._next_arrival].arrival_s)
        totals = ReplayTotals(
            iterations=self._iterations,
            simulated_s=self.now_s,
            wall_s=time.perf_counter() - started,
            bytes_d2h=self._bytes_d2h,
            bytes_h2d=self._bytes_h2d,
            stall_s=self._stall_s,
            preemptions=self._preemptions,
            swap_outs=self._swap_outs,
            swap_ins=self._swap_ins,
            peak_gpu_kv_blocks=self._peak_gpu,
            gpu_kv_blocks_total=self.config.gpu_kv_blocks,
        )
        return ReplayResult(
            policy=self.scheduler.name,
            requests=[r.outcome for r in sorted(self.requests, key=lambda r: r.index)],
            timeline=self.timeline,
            totals=totals,
        )

    def _arrive(self) -> None:
        reqs = self.requests
        bs = self.config.block_size_tokens
        while self._next_arrival < len(reqs) and reqs[self._next_arrival].arrival_s <= self.now_s:
            r = reqs[self._next_arrival]
            self._next_arrival += 1
            most = max(
                r.blocks_for(r.prompt_tokens + r.output_tokens - 1, bs),
                r.blocks_for(r.prompt_tokens, bs) + 1,
            )
            if most > self.config.gpu_kv_blocks:
                r.phase = Phase.REJECTED
                continue
            r.phase = Phase.QUEUED
            self.queued.append(r)

    def _stalled(self) -> bool:
        """The last iteration processed no token and left nothing running or
        being swapped in: the state cannot change until the next arrival."""
        if self.running or self.in_transit or not self.timeline:
            return False
        last = self.timeline[-1]
        return last.prefill_tokens == 0 and last.decode_tokens == 0

    def _iteration(self) -> None:
        cfg = self.config
        bs = cfg.block_size_tokens
        for r in self.in_transit:
            r.phase = Phase.RUNNING
            r.run_start_s = self.now_s
            self.running.append(r)
        self.in_transit = []
        plan = self.scheduler.plan(
            EngineView(
                now_s=self.now_s,
                queued=list(self.queued),
                running=list(self.running),
                rotary=list(self.rotary),
                free_gpu_blocks=self.free_gpu,
                free_cpu_blocks=self.free_cpu,
                block_size_tokens=bs,
                last_iteration_s=self._last_iteration_s,
            )
        )
        d2h_blocks, h2d_blocks = self._apply(plan)
        prefill_tokens, decode_tokens, context_tokens, emitting = self._form_batch()
        d2h_blocks += self._preempted_blocks
        compute_s = self.cost.iteration_time_s(prefill_tokens, decode_tokens, context_tokens)
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
        self._peak_gpu = max(self._peak_gpu, cfg.gpu_kv_blocks - self.free_gpu)
        for r in emitting:
            self._emit(r)
        used = cfg.gpu_kv_blocks - self.free_gpu
        self.timeline.append(
            TimelineSample(
                time_s=self.now_s,
                iteration_s=compute_s + stall_s,
                stall_s=stall_s,
                gpu_kv_blocks_used=used,
                cpu_kv_blocks_used=cfg.cpu_kv_blocks - self.free_cpu,
                running=len(self.running),
                waiting=len(self.queued),
                rotary=len(self.rotary) + len(self.in_transit),
                prefill_tokens=prefill_tokens,
                decode_tokens=decode_tokens,
            )
        )

    # -- carrying out a plan ------------------------------------------------

    def _apply(self, plan: SchedulePlan) -> tuple[int, int]:
        """Preempt, then start in priority order while blocks last. Returns
        blocks copied out and in."""
        d2h = 0
        h2d = 0
        for r in plan.swap_out:
            if r.phase == Phase.RUNNING:
                d2h += self._swap_out(r)
        for r in plan.recompute:
            if r.phase == Phase.RUNNING:
                self._recompute(r)
        bs = self.config.block_size_tokens
        # A queued request starts only when this iteration's token budget
        # still has room for (part of) its prefill, as vLLM's scheduler
        # admits waiting requests; otherwise it would hold blocks idle.
        prefill_room = self._prefill_room()
        in_order = self.scheduler.in_order
        for r in plan.start:
            if len(self.running) + len(self.in_transit) >= self.config.max_running:
                break
            if r.phase == Phase.QUEUED and prefill_room <= 0:
                if in_order:
                    break
                continue
            need = blocks_needed(r, bs)
            if need > self.free_gpu:
                if in_order:
                    break
                continue
            if r.phase == Phase.QUEUED:
                prefill_room -= r.prefill_target - r.kv_tokens
                self.queued.remove(r)
                self.free_gpu -= need
                r.gpu_blocks = need
                r.phase = Phase.RUNNING
                r.run_start_s = self.now_s
                r.admitted_at_s = self.now_s
                self.running.append(r)
            elif r.phase == Phase.ROTARY:
                h2d += self._swap_in(r, need)
        if plan.eager_blocks:
            d2h += self._eager(plan.eager_blocks)
        return d2h, h2d

    def _prefill_room(self) -> int:
        """Tokens of this iteration's budget left after the running requests'
        decodes and unfinished prefills."""
        room = self.config.max_batched_tokens
        for r in self.running:
            left = r.prefill_target - r.kv_tokens
            room -= left if left > 0 else 1
        return room

    def _swap_out(self, r: SimRequest) -> int:
        """KV to CPU: copies the blocks that have no CPU copy yet and returns
        how many. When the CPU pool cannot take them the request is preempted
        by recompute instead (0 copied)."""
        dirty = r.gpu_blocks - r.synced_blocks
        if dirty > self.free_cpu or r.kv_tokens == 0:
            # Nothing computed yet (or no CPU room): back to the queue, which
            # for a request without KV loses nothing.
            self._recompute(r)
            return 0
        self.running.remove(r)
        self.free_cpu -= dirty
        r.cpu_blocks += dirty
        self.free_gpu += r.gpu_blocks
        r.gpu_blocks = 0
        r.synced_blocks = 0
        r.phase = Phase.ROTARY
        self.rotary.append(r)
        self._preemptions += 1
        self._swap_outs += 1
        r.outcome.preemptions += 1
        r.outcome.swap_outs += 1
        return dirty

    def _swap_in(self, r: SimRequest, need: int) -> int:
        self.rotary.remove(r)
        self.free_gpu -= need
        r.gpu_blocks = need
        moved = r.cpu_blocks
        if self.scheduler.keeps_cpu_copies:
            r.synced_blocks = min(r.kv_tokens // self.config.block_size_tokens, need, r.cpu_blocks)
            extra = r.cpu_blocks - r.synced_blocks
            self.free_cpu += extra
            r.cpu_blocks = r.synced_blocks
        else:
            self.free_cpu += r.cpu_blocks
            r.cpu_blocks = 0
            r.synced_blocks = 0
        r.phase = Phase.IN_TRANSIT
        self.in_transit.append(r)
        self._swap_ins += 1
        r.outcome.swap_ins += 1
        return moved

    def _recompute(self, r: SimRequest) -> None:
        """Drop the KV; the request re-queues at the head and recomputes its
        prompt and the tokens generated so far."""
        self.running.remove(r)
        self.free_gpu += r.gpu_blocks
        self.free_cpu += r.cpu_blocks
        r.outcome.recomputed_tokens += r.kv_tokens
        r.gpu_blocks = r.cpu_blocks = r.synced_blocks = 0
        r.kv_tokens = 0
        r.prefill_target = r.prompt_tokens + r.generated
        r.phase = Phase.QUEUED
        self.queued.insert(0, r)
        self._preemptions += 1
        r.outcome.preemptions += 1

    def _eager(self, budget: int) -> int:
        """DuplexKV eager copies: newly full blocks of running requests,
        longest running first, become SYNCED."""
        bs = self.config.block_size_tokens
        copied = 0
        for r in sorted(self.running, key=lambda r: (r.run_start_s, r.index)):
            if copied >= budget or self.free_cpu <= 0:
                break
            fresh = min(r.full_blocks(bs) - r.synced_blocks, budget - copied, self.free_cpu)
            if fresh <= 0:
                continue
            r.synced_blocks += fresh
            r.cpu_blocks += fresh
            self.free_cpu -= fresh
            copied += fresh
        return copied

    # -- the batch ----------------------------------------------------------

    def _form_batch(self) -> tuple[int, int, int, list[SimRequest]]:
        """Token budget: decodes first, then prefill chunks in admission
        order. Returns prefill tokens, decode tokens, attended context tokens
        and the requests that emit a token at the end of the iteration."""
        cfg = self.config
        bs = cfg.block_size_tokens
        self._preempted_blocks = 0
        budget = cfg.max_batched_tokens
        decode_tokens = 0
        prefill_tokens = 0
        context = 0
        emitting: list[SimRequest] = []
        running_phase = Phase.RUNNING
        prefilling: list[SimRequest] = []
        for r in list(self.running):
            if r.phase != running_phase:
                continue
            if r.kv_tokens < r.prefill_target:
                prefilling.append(r)
                continue
            if budget <= 0:
                continue
            if r.kv_tokens + 1 > r.gpu_blocks * bs and not self._grow(r):
                continue
            r.kv_tokens += 1
            budget -= 1
            decode_tokens += 1
            context += r.kv_tokens
            emitting.append(r)
        for r in prefilling:
            if budget <= 0:
                break
            if r.phase != running_phase:
                continue
            chunk = min(r.prefill_target - r.kv_tokens, budget)
            r.kv_tokens += chunk
            budget -= chunk
            prefill_tokens += chunk
            context += r.kv_tokens
            r.last_progress_s = self.now_s
            if r.kv_tokens >= r.prefill_target:
                emitting.append(r)
        return prefill_tokens, decode_tokens, context, emitting

    def _grow(self, r: SimRequest) -> bool:
        """One more block for r, preempting the most recently admitted other
        requests while none is free. False when r itself had to go."""
        while self.free_gpu == 0:
            victim = self.running[-1]
            before = self.free_gpu
            if self.scheduler.swaps:
                self._preempted_blocks += self._swap_out(victim)
            else:
                self._recompute(victim)
            if victim is r:
                return False
            if self.free_gpu == before:
                return False
        self.free_gpu -= 1
        r.gpu_blocks += 1
        return True

    def _emit(self, r: SimRequest) -> None:
        if r.phase != Phase.RUNNING:
            return
        r.generated += 1
        r.outcome.token_times_s.append(self.now_s)
        r.last_progress_s = self.now_s
        if r.generated >= r.output_tokens:
            r.phase = Phase.FINISHED
            r.outcome.finish_s = self.now_s
            self.running.remove(r)
            self.free_gpu += r.gpu_blocks
            self.free_cpu += r.cpu_blocks
            r.gpu_blocks = r.cpu_blocks = r.synced_blocks = 0
