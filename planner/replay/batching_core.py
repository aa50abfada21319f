"""The batching core of a simulated serving engine: one iteration of
continuous batching with chunked prefill over paged KV in GPU and CPU block
pools, swaps through a link model that overlaps with compute (what does not
fit stalls the iteration), and preemption by swap or recompute.

One iteration: requests swapped in during the last one start running; the
scheduler decides; preemptions free blocks first, then admissions and
resumptions take blocks in priority order while they fit (a resumed
request's KV travels during this iteration and it runs from the next one);
running requests decode one token each and prefilling ones take chunks of
the token budget in admission order; a request that needs a new block when
none is free forces a preemption of the most recently admitted request (by
swap, or by recompute for policies that do not swap); the iteration lasts
max(compute, transfers).

A topology wires cores: it feeds them arrivals (EngineState.arrive) and
decides when each runs an iteration (planner.replay.engine: one core, its
own clock, quiet stretches run in one step). The requests' state lives in
numpy columns (planner.replay.state), moves between queues and pools in
planner.replay.engine_state, and the batch works on all running requests at
once (planner.replay.batch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from planner.domain.requests import Slo
from planner.replay.batch import Batch, form_batch, form_batch_of, whole_prefills
from planner.replay.engine_state import EngineState
from planner.replay.kv_residency import KvResidency, PicksRows
from planner.replay.models import AttentionPairsCost, IterationCost, TransferCost
from planner.replay.prefix_cache import PrefixCache
from planner.replay.records import RequestOutcome, TimelineSample
from planner.replay.schedulers import (
    NO_PLAN,
    EngineView,
    PlansFromClock,
    SchedulePlan,
    Scheduler,
)
from planner.replay.state import IntArray, Phase, RequestColumns, start_candidates
from planner.replay.tokens import TokenTimes
from planner.trace.records import TraceRequest

# Plain ints: comparing with an enum member costs an attribute lookup each time.
_QUEUED = int(Phase.QUEUED)
_ROTARY = int(Phase.ROTARY)
# An iteration whose queue head cannot start does not ask a scheduler that
# only starts the queue (Scheduler.starts_queue_only); False: it asks (the
# same moves, slower; tests compare the two ways).
SKIPS_BLOCKED_HEAD = True
# Rows below which a filter of running goes request by request.
_FEW_ROWS = 64


def never_fits(requests: RequestColumns, gpu_blocks: int, block_size: int) -> npt.NDArray[np.bool_]:
    """Which requests are rejected on arrival: those whose KV at the last
    token (prompt plus output minus one tokens) needs more blocks than the
    whole GPU pool, which could never finish, and those whose prompt does not
    fit with one block to spare."""
    r = requests
    most = np.maximum(
        -(-(r.prompt_tokens + r.output_tokens - 1) // block_size),
        -(-r.prompt_tokens // block_size) + 1,
    )
    fits_not: npt.NDArray[np.bool_] = most > gpu_blocks
    return fits_not


def _without(rows: IntArray, drop: IntArray) -> IntArray:
    """rows (in order) less those in drop; a few by a set, which costs less
    than np.isin on small arrays."""
    if len(rows) > _FEW_ROWS:
        kept: IntArray = rows[~np.isin(rows, drop)]
        return kept
    gone = set(drop.tolist())
    return np.array([row for row in rows.tolist() if row not in gone], dtype=np.int64)


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
    # Serial per-request work in front of the engine (a measured profile's
    # admission_s_per_request: request setup, tokenization, the hand-over to
    # the engine): past request_latency_s, requests go through it one at a
    # time in arrival order, each taking this long, and reach the engine when
    # done; their latencies are still counted from the arrival. 0: no queue.
    admission_s_per_request: float = 0.0
    # The same front end's work per output token it streams (a measured
    # profile's stream_s_per_token): one server serves admissions and the
    # running requests' tokens in the order they come, so a request waits
    # behind the tokens streamed before it arrived. 0: admissions only.
    stream_s_per_token: float = 0.0
    # And its work per engine step whose tokens it streams (a measured
    # profile's stream_s_per_step): the step's output batch, once, on top of
    # its tokens. 0: none.
    stream_s_per_step: float = 0.0
    # Seconds an iteration spends per sequence it prefills (the cost model's
    # prefill_s_per_sequence): charged on top of the cost model's time.
    prefill_s_per_sequence: float = 0.0
    # Seconds the engine's scheduler spends per call to its planning policy
    # (a measured profile's planning_s_per_call: a planner plugin's call in
    # the engine's process): charged to each iteration whose plan asked it.
    planning_s_per_call: float = 0.0
    # The front end's work per prompt token once it has taken a request up
    # (a measured profile's tokenize_s_per_prompt_token; with the streaming
    # front end only: planner.replay.engine.front_end_passage_s).
    tokenize_s_per_prompt_token: float = 0.0
    # Automatic prefix caching over the trace's prefix_block_ids, each id
    # standing for prefix_block_tokens tokens (planner.replay.prefix_cache).
    prefix_cache: bool = False
    prefix_block_tokens: int = 512
    # Options for topologies wiring several cores: a prefill chunk takes at
    # most this many tokens (None: the budget); an iteration with nothing to
    # compute or copy takes no time and is not counted (else it takes the
    # cost model's time of an empty batch); a timeline sample per iteration.
    max_chunk_tokens: int | None = None
    skips_empty_iterations: bool = False
    records_timeline: bool = True
    # Prefills are whole prompts in iterations of their own: while a running
    # request has a prefill to do, the iteration prefills every such request
    # entirely and decodes nobody (vLLM without chunked prefill).
    prefills_alone: bool = False


def request_outcomes(
    requests: RequestColumns,
    trace: Sequence[TraceRequest],
    tokens: TokenTimes,
    slo: Slo,
    cached_tokens: Sequence[int] | None = None,
    *,
    token_times: Sequence[list[float]] | None = None,
) -> list[RequestOutcome]:
    """Each request's outcome (row i is trace[i]); slo: the default SLOs of
    requests that name none; cached_tokens: each request's prompt tokens the
    prefix cache held at its first start (none: no cache); token_times: the
    times the user saw each request's tokens, when not those tokens recorded
    (an output path that holds tokens back)."""
    r = requests
    cached = cached_tokens if cached_tokens is not None else [0] * len(r)
    times_of = token_times if token_times is not None else tokens.per_request(r.generated)
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
            cached_tokens=hit,
        )
        for id, t, times, finish, preemptions, swap_outs, swap_ins, recomputed, hit in zip(
            r.ids,
            trace,
            times_of,
            r.finish_s.tolist(),
            r.preemptions.tolist(),
            r.swap_outs.tolist(),
            r.swap_ins.tolist(),
            r.recomputed_tokens.tolist(),
            cached,
            strict=True,
        )
    ]


class BatchingCore:
    """One engine's requests, KV pools, scheduler, cost and link, its clock
    and its run's counters; _iteration runs one iteration from now_s (the
    topology that wires the core calls it).

    pairs_cost, when given, times the iterations in place of cost and also
    charges the prefill chunks' causal attention pairs. link may be None for
    an engine that never copies KV (a recompute-only scheduler without eager
    copies). tokens: token times shared with other cores over the same
    request columns. residency, when given, pauses running requests before
    each decode batch (or names those that run: kv_residency.PicksRows) and
    times every iteration in place of the link term (per-layer KV
    residency, planner.replay.kv_residency)."""

    def __init__(
        self,
        config: EngineConfig,
        scheduler: Scheduler,
        cost: IterationCost,
        link: TransferCost | None,
        requests: RequestColumns,
        *,
        prefix: PrefixCache | None = None,
        pairs_cost: AttentionPairsCost | None = None,
        tokens: TokenTimes | None = None,
        residency: KvResidency | None = None,
    ) -> None:
        self.config = config
        self.residency = residency
        self.scheduler = scheduler
        self.cost = cost
        self.pairs_cost = pairs_cost
        self.link = link
        self.requests = requests
        self.prefix = prefix
        self.state = EngineState(
            requests,
            config.gpu_kv_blocks,
            config.cpu_kv_blocks,
            config.block_size_tokens,
            prefix=prefix,
            tokens=tokens,
        )
        self.now_s = 0.0
        self.timeline: list[TimelineSample] = []
        self._last_iteration_s = 0.0
        self._bytes_d2h = 0
        self._bytes_h2d = 0
        self._stall_s = 0.0
        self._peak_gpu = 0
        self._iterations = 0
        # Blocks a start costs are its start_blocks only without a prefix cache.
        self._skips_blocked_head = (
            SKIPS_BLOCKED_HEAD and scheduler.starts_queue_only and prefix is None
        )
        self._plan_at = scheduler.plan_at if isinstance(scheduler, PlansFromClock) else None
        self._runs = residency.runs if isinstance(residency, PicksRows) else None

    # -- one iteration ------------------------------------------------------

    def _iteration(self) -> Batch:
        """One iteration from now_s; now_s moves to its end (unless it was
        empty and the config skips empty iterations). Returns its batch."""
        cfg = self.config
        s = self.state
        if len(s.in_transit.rows):
            s.start_running(self.now_s)
        queued = s.queued.rows
        if self.scheduler.idle_unless_waiting and not (len(queued) or len(s.rotary.rows)):
            # Nobody waits: such a scheduler has nothing to say.
            plan = NO_PLAN
        elif self._skips_blocked_head and (
            not len(queued)
            or len(s.running.rows) + len(s.in_transit.rows) >= cfg.max_running
            or self.requests.start_blocks.item(queued[0]) > s.free_gpu
        ):
            # The queue's head cannot start, so such a scheduler starts nobody.
            plan = NO_PLAN
        elif self._plan_at is not None:
            plan = self._plan_at(self.now_s)
        else:
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
                    prefix=self.prefix,
                )
            )
        if plan is NO_PLAN:
            d2h_blocks = h2d_blocks = 0
            starting = False
            planning_s = 0.0
        else:
            d2h_blocks, h2d_blocks = self._apply(plan)
            starting = len(plan.start) > 0
            planning_s = cfg.planning_s_per_call if plan.asked_policy else 0.0
        held = s.held_back(self.now_s) if s.not_before_s else None
        everyone = s.running.rows
        if held is not None and len(held):
            s.running.rows = _without(everyone, held)
        residency = self.residency
        # With whole prefills, only a request started now has one to do.
        batch = whole_prefills(s, self.now_s) if starting and cfg.prefills_alone else None
        if residency is not None and batch is None:
            # Rows named to run form the batch alone where none can preempt
            # and nobody is held back; otherwise the rest is paused.
            runs = self._runs(s, self.now_s) if self._runs is not None else None
            if runs is not None and s.free_gpu >= len(runs) and s.running.rows is everyone:
                batch = form_batch_of(
                    s, runs, cfg.max_batched_tokens, self.now_s, cfg.max_chunk_tokens
                )
            else:
                paused = (
                    residency.paused(s, self.now_s)
                    if runs is None
                    else _without(s.running.rows, np.array(runs, dtype=np.int64))
                )
                if len(paused):
                    s.running.rows = _without(s.running.rows, paused)
                    held = paused
        if batch is None:
            batch = form_batch(
                s, cfg.max_batched_tokens, self.now_s, self.scheduler.swaps, cfg.max_chunk_tokens
            )
        if held is not None and len(held):
            # Back in their places (finished ones leave at emit, below).
            s.running.rows = everyone[self.requests.phase[everyone] == Phase.RUNNING]
        d2h_blocks += batch.preempted_d2h_blocks
        d2h_bytes = d2h_blocks * cfg.block_bytes
        h2d_bytes = h2d_blocks * cfg.block_bytes
        if (
            cfg.skips_empty_iterations
            and not (batch.prefill_tokens or batch.decode_tokens)
            and not (d2h_bytes or h2d_bytes)
        ):
            return batch
        compute_s = self._compute_s(batch) + planning_s
        transfer_s = 0.0
        if d2h_bytes or h2d_bytes:
            if self.link is None:
                raise ValueError("this engine has no link to copy KV over")
            transfer_s = self.link.transfer_time_s(d2h_bytes, h2d_bytes, cfg.block_bytes)
        if residency is None:
            stall_s = transfer_s - compute_s if transfer_s > compute_s else 0.0
            iteration_s = compute_s + stall_s
            # While the batch holds its blocks, before finished requests free theirs.
            gpu_used = cfg.gpu_kv_blocks - s.free_gpu
        else:
            iteration_s, stall_s, gpu_used, fetched = residency.timed(batch, compute_s)
            h2d_bytes += fetched
        self.now_s += iteration_s
        self._last_iteration_s = compute_s
        self._bytes_d2h += d2h_bytes
        self._bytes_h2d += h2d_bytes
        self._stall_s += stall_s
        self._iterations += 1
        self._peak_gpu = max(self._peak_gpu, gpu_used)
        if len(batch.emitting):
            s.emit(batch.emitting, self.now_s)
        if residency is None:
            gpu_used = cfg.gpu_kv_blocks - s.free_gpu
        else:
            residency.emitted(s, batch, self.now_s)
        if not cfg.records_timeline:
            return batch
        self.timeline.append(
            TimelineSample(
                time_s=self.now_s,
                iteration_s=iteration_s,
                stall_s=stall_s,
                gpu_kv_blocks_used=gpu_used,
                cpu_kv_blocks_used=cfg.cpu_kv_blocks - s.free_cpu,
                running=len(s.running.rows),
                waiting=len(s.queued.rows),
                rotary=len(s.rotary.rows) + len(s.in_transit.rows),
                prefill_tokens=batch.prefill_tokens,
                decode_tokens=batch.decode_tokens,
                prefill_sequences=len(batch.prefill_rows),
            )
        )
        return batch

    def _compute_s(self, batch: Batch) -> float:
        """Seconds the batch computes: the cost model's, plus the time per
        sequence it prefills."""
        prefilling = len(batch.prefill_rows)
        pairs_cost = self.pairs_cost
        if pairs_cost is not None:
            model_s = pairs_cost.iteration_time_s(
                batch.prefill_tokens,
                batch.decode_tokens,
                batch.context_tokens,
                batch.prefill_attention_pairs(self.requests.kv_tokens) if prefilling else 0,
            )
        else:
            model_s = self.cost.iteration_time_s(
                batch.prefill_tokens, batch.decode_tokens, batch.context_tokens
            )
        return model_s + self.config.prefill_s_per_sequence * prefilling

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
            cost, cached = s.start_cost(row, need, was)
            if cost > free:
                if in_order:
                    break
                continue
            if was == _QUEUED:
                if prefill_room is None:
                    prefill_room = self._prefill_room()
                if prefill_room <= 0:
                    if in_order:
                        break
                    continue
                prefill_room -= int(r.prefill_target[row] - r.kv_tokens[row]) - cached
                if s.prefix is None:
                    admitted.append(row)
                    admitted_needs.append(need)
                else:
                    # Started at once: its hits leave the free queue before
                    # the next one's blocks are taken from it, so the next
                    # cost is counted on what is still cached.
                    s.admit([row], [need], self.now_s)
            elif was == _ROTARY:
                resumed.append(row)
                resumed_needs.append(need)
            else:
                continue
            free -= cost
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
