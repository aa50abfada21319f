"""The cluster replay topology: N instances of one model behind a
least-loaded dispatcher (DESIGN.md §3.3, §4; KunServe and its baselines).

Model (simulated time; deterministic, and random only through seeded noise):

- **Instance**: a batching core (planner.replay.batching_core, the single
  engine's: continuous batching with chunked prefill, ``max_batched_tokens``
  per iteration, at most ``max_running`` requests, paged KV in blocks of
  ``block_size`` tokens) over a KV region of its own (the HBM the full
  replica leaves), with the fcfs scheduler. Admission is in queue order
  without skipping: the head joins while its prompt's blocks fit and the
  iteration's token budget has room for its prefill. A decode that needs a
  new block when none is free preempts the most recently admitted request
  not being migrated (the grower itself included; recompute, vLLM's
  default: its KV is freed, it goes back to the queue's head and prefills
  prompt + generated tokens again). The iteration time is the profile's cost
  model ``iteration_time_s(prefill, decode, attended context, causal
  pairs)`` (the core's pairs option). The cluster is wiring: one set of
  request columns, one core per unit, requests handed between cores
  (EngineState.hand_over) when units merge, restore, balance queues or
  migrate, and the core's two hooks: a request being migrated is pinned
  (never a victim), and one migrated runs from its last token's time.
- **Unit**: what the dispatcher sees, one instance or a buddy group. A group
  of g instances holds one replica split into g contiguous layer ranges
  (planner.policies.buddy's plan); its KV capacity is its members' regions
  plus the parameters they dropped, (g - 1) * P. It runs a pipeline: the
  batch is split into min(g, requests) micro-batches, balanced by tokens
  (prefill chunks largest first, then decodes, each to the micro-batch with
  the fewest tokens); a stage's time for a micro-batch is the cost model's
  iteration time of that micro-batch times the stage's layer share, plus the
  activation transfer (tokens x hidden x 2 bytes) to the next stage over the
  inter-instance link; a request gets one token per round, round = g x the
  slowest micro-batch's stage time (each micro-batch passes every stage
  once, so a lone request pays the whole pipeline: bubbles) + (g - 1)
  activation hops. The unit's core gets a budget of g x
  ``max_batched_tokens`` per round, a chunk at most ``max_batched_tokens``
  (one micro-batch's).
- **Dispatcher** (every policy): a new request goes to a unit whose KV
  demand leaves room for it (demand = allocated blocks + the queued
  requests' prompt blocks as the core admits them, the paper's
  "in-processing and head-of-line queuing" count), the one with the fewest
  queued prompt tokens per instance, then the lowest demand / capacity;
  when no unit has room, the lowest demand / capacity. (Memory alone would
  herd a burst onto a freshly merged group, whose capacity jumps while its
  compute does not.)
- **KunServe** (policy ``kunserve``): every ``monitor_interval_s`` each
  lone instance's demand and capacity feed its drop trigger
  (planner.policies.buddy.InstanceMonitor: drop when exhaustion is predicted
  within the horizon). When one fires, the lone instances are planned with
  the throughput-greedy policy (planner.policies.buddy.plan_buddy_groups,
  required bytes = the trigger's predicted shortfall, Thpt_g from this
  model's pipeline) and the merged groups form at once: the dropped
  parameters' memory is usable immediately. The members' running requests
  (victims) keep decoding in the group; until their KV has moved to the
  stages that now hold its layers they pay remote attention (an extra
  activation round trip per round) and the KV moves in chunks of
  planner.policies.buddy.exchange_chunk_bytes (the largest that fits between
  two activation transfers): one chunk per link per round. A group restores
  (planner.policies.buddy.RestoreMonitor hysteresis: demand under the low
  watermark of the members' full-replica regions for hold_s) by reloading
  the dropped layers over the host link while its requests keep running;
  its capacity shrinks to the restored regions at the start, and at the end
  its requests are packed onto the members (first-fit decreasing by
  blocks; one that fits nowhere is preempted).
- **Queue balancing** (every policy, Llumnix-like): at every monitor tick
  queued requests, which have no KV yet, move from a unit whose queue head
  is blocked to the least loaded unit with room and an empty queue.
- **Baselines**: ``replication`` (every instance a full replica, with the
  dispatcher and queue balancing above); ``kv-migration`` (that plus Llumnix's live KV
  migration: a blocked instance moves its shortest running request to the
  instance with the most free blocks, which reserves the blocks for the
  copy's duration, KV bytes / link; the request keeps decoding at the source
  meanwhile); ``static-pp`` (fixed groups of ``static_group_size`` from the
  start, never restored).

- **Noise** (``jitter_cv``, ``seed``): every iteration time the cost model
  gives (each micro-batch's in a group) is multiplied by the next factor of
  planner.replay.noise's seeded lognormal stream, one stream per run;
  KunServe's throughput profile stays the model's.

Memory is checked after every change (``over_capacity`` counts violations,
which would be a bug). Requests are rejected on arrival by the single
engine's rule over one instance's region (batching_core.never_fits: the KV
at the last token, or the prompt with a block to spare, does not fit), every
policy alike.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from planner.domain.cluster import ClusterInputs, Instance, Strategy, ThroughputProfile
from planner.domain.requests import Slo
from planner.policies.buddy import (
    InstanceMonitor,
    RestoreConfig,
    RestoreMonitor,
    TriggerConfig,
    exchange_chunk_bytes,
    plan_buddy_groups,
)
from planner.replay.batch import Batch
from planner.replay.batching_core import (
    BatchingCore,
    EngineConfig,
    never_fits,
    request_outcomes,
)
from planner.replay.cluster_events import (
    ClusterWiring,
    MigrationEnds,
    MonitorTicks,
    RequestArrives,
    RestoreEnds,
    UnitSteps,
)
from planner.replay.cluster_policies import CLUSTER_POLICIES
from planner.replay.engine_state import EngineState
from planner.replay.events import EventLoop
from planner.replay.models import AttentionPairsCost
from planner.replay.noise import JitteredAttentionPairsCost
from planner.replay.records import ReplayResult, ReplayTotals, TimelineSample
from planner.replay.schedulers import Fcfs
from planner.replay.state import IntArray, Phase, RequestColumns, blocks_needed_one
from planner.replay.tokens import TokenTimes
from planner.trace.records import TraceRequest

ACTIVATION_BYTES = 2  # bf16 hidden state per token
# A run still going this long after the last arrival is stuck (a bug).
NO_PROGRESS_S = 1e6
# kv-migration moves a request only to an instance this much less loaded
# (KV demand / capacity).
MIGRATION_MARGIN = 0.1
_NONE: IntArray = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    instances: int
    kv_blocks_per_instance: int
    block_size: int
    kv_bytes_per_token: int  # all layers
    param_bytes: int
    num_layers: int
    hidden_size: int
    link_gbps: float  # instance to instance (activations, KV exchange, migration)
    reload_gbps: float  # host to GPU (parameter restore)
    max_batched_tokens: int = 2048
    max_running: int = 256
    slo: Slo = field(default_factory=Slo)
    static_group_size: int = 2
    max_group_size: int = 8
    monitor_interval_s: float = 0.1
    trigger: TriggerConfig = field(default_factory=TriggerConfig)
    restore: RestoreConfig = field(default_factory=RestoreConfig)
    # Every instance's iteration times times seeded lognormal noise with
    # mean 1 and this coefficient of variation (planner.replay.noise).
    jitter_cv: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in (
            "instances",
            "kv_blocks_per_instance",
            "block_size",
            "kv_bytes_per_token",
            "num_layers",
            "hidden_size",
            "max_batched_tokens",
            "max_running",
            "static_group_size",
            "max_group_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.param_bytes < 0:
            raise ValueError(f"param_bytes must be >= 0, got {self.param_bytes}")
        if not (math.isfinite(self.jitter_cv) and self.jitter_cv >= 0):
            raise ValueError(f"jitter_cv must be a finite number >= 0, got {self.jitter_cv}")
        for name in ("link_gbps", "reload_gbps", "monitor_interval_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {v}")
        if self.static_group_size > self.instances:
            raise ValueError(
                f"static_group_size {self.static_group_size} exceeds {self.instances} instances"
            )

    @property
    def block_bytes(self) -> int:
        return self.kv_bytes_per_token * self.block_size

    @property
    def link_bytes_per_s(self) -> float:
        return self.link_gbps * 1e9


@dataclass(slots=True)
class ClusterStats:
    drops: int = 0
    restores: int = 0
    groups_formed: int = 0
    max_merged_instances: int = 0
    grouped_instance_s: float = 0.0
    exchange_bytes: int = 0
    reload_bytes: int = 0
    migrations: int = 0
    migrated_bytes: int = 0
    queue_moves: int = 0
    preemptions: int = 0
    rejected: int = 0
    over_capacity: int = 0
    events: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ClusterRun:
    result: ReplayResult
    stats: ClusterStats


class _GroupCore(BatchingCore):
    """A buddy group's batching core: its round is timed as its pipeline
    (ClusterEngine._round_s). A lone instance's core is the plain
    BatchingCore, its iteration timed with the prefill's causal attention
    pairs."""

    def __init__(
        self, unit: _Unit, engine: ClusterEngine, config: EngineConfig, scheduler: Fcfs
    ) -> None:
        super().__init__(
            config,
            scheduler,
            engine.cost,
            None,
            engine.requests,
            pairs_cost=engine.cost,
            tokens=engine.tokens,
        )
        self.unit = unit
        self.engine = engine

    def _compute_s(self, batch: Batch) -> float:
        return self.engine._round_s(self.unit, batch)


@dataclass(slots=True, eq=False)
class _Unit:
    uid: int
    members: tuple[int, ...]  # instance indices, pipeline order
    shares: tuple[float, ...]  # layer share of each stage
    capacity: int  # blocks
    base_capacity: int  # blocks of the members' own regions (full replicas)
    core: BatchingCore = field(init=False)
    reserved: int = 0  # blocks held for incoming migrations
    busy_until: float = 0.0
    scheduled: bool = False
    alive: bool = True
    formed_at: float = 0.0
    exchange_left: float = 0.0  # bytes still to move on the busiest link
    # Rows decoding by remote attention while their KV moves (from a merge).
    victims: set[int] = field(default_factory=set)
    restoring_until: float | None = None
    restore_monitor: RestoreMonitor = field(default_factory=RestoreMonitor)
    last_used: int = 0
    last_tick: float = 0.0
    migrating_out: bool = False
    dynamic: bool = False  # formed by a drop (restorable)

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def state(self) -> EngineState:
        return self.core.state

    @property
    def used(self) -> int:
        return self.capacity - self.core.state.free_gpu - self.reserved

    @property
    def running(self) -> IntArray:
        return self.core.state.running.rows

    @property
    def waiting(self) -> IntArray:
        return self.core.state.queued.rows

    def free(self) -> int:
        return self.core.state.free_gpu

    def queued_blocks(self) -> int:
        return int(self.core.requests.start_blocks[self.waiting].sum())

    def demand(self) -> int:
        return self.used + self.reserved + self.queued_blocks()


def throughput_profile(
    cost: AttentionPairsCost, config: ClusterConfig, max_g: int
) -> ThroughputProfile:
    """Thpt_g(g) of this model's pipeline: decode tokens per second of a
    group of g serving g x 32 requests of 1,024 context tokens (one
    instance: 32)."""
    per_instance = 32
    context = 1024
    out = []
    for g in range(1, max_g + 1):
        batch = per_instance * g
        t = _round_time(cost, config, g, [(0, batch, batch * context, 0, batch)])
        out.append(batch / t if t > 0 else 1.0)
    return ThroughputProfile(tuple(out))


def _round_time(
    cost: AttentionPairsCost,
    config: ClusterConfig,
    g: int,
    micro: Sequence[tuple[int, int, int, int, int]],
    shares: Sequence[float] | None = None,
) -> float:
    """micro: (prefill, decode, context, pairs, tokens) of each micro-batch.
    g == 1: one iteration of everything."""
    if g == 1:
        p = sum(m[0] for m in micro)
        d = sum(m[1] for m in micro)
        c = sum(m[2] for m in micro)
        x = sum(m[3] for m in micro)
        return cost.iteration_time_s(p, d, c, x)
    share = max(shares) if shares else 1.0 / g
    slowest = 0.0
    hop = 0.0
    for p, d, c, x, tokens in micro:
        slowest = max(slowest, cost.iteration_time_s(p, d, c, x) * share)
        hop = max(hop, tokens * config.hidden_size * ACTIVATION_BYTES / config.link_bytes_per_s)
    return g * slowest + (g - 1) * hop


class ClusterEngine:
    def __init__(
        self,
        config: ClusterConfig,
        policy: str,
        cost: AttentionPairsCost,
        trace: Sequence[TraceRequest],
    ) -> None:
        self.rules = CLUSTER_POLICIES[policy]
        self.c = config
        self.policy = policy
        # One noise sequence per run, seeded alike for every policy; the
        # throughput profile KunServe plans with stays the model's.
        self.cost: AttentionPairsCost = (
            JitteredAttentionPairsCost(cost, config.jitter_cv, config.seed)
            if config.jitter_cv > 0
            else cost
        )
        self.trace = sorted(trace, key=lambda t: t.arrival_s)
        # Every unit's core works on these columns (row i is self.trace[i]).
        self.requests = RequestColumns.from_trace(self.trace, config.slo)
        self.tokens = TokenTimes(self.requests.output_tokens)
        self.stats = ClusterStats()
        self.units: list[_Unit] = []
        self.unit_of: list[_Unit] = []  # instance index -> its unit
        self._units_by_uid: dict[int, _Unit] = {}
        self._progress: Callable[[float], None] | None = None
        self.monitors: dict[int, InstanceMonitor] = {}
        self._events: EventLoop[ClusterWiring] = EventLoop()
        self._migrations = 0  # migrations started (each one's key)
        self._uid = 0
        self._pending = 0
        self._iterations = 0
        self._timeline: list[TimelineSample] = []
        self.profile = throughput_profile(cost, config, min(config.max_group_size, 64))
        self._last_arrival = self.trace[-1].arrival_s if self.trace else 0.0
        self._mig_state: dict[int, tuple[int, _Unit, _Unit, int]] = {}

    # --- setup -------------------------------------------------------------------

    def _new_unit(self, members: Sequence[int], now: float, dynamic: bool = False) -> _Unit:
        c = self.c
        g = len(members)
        shares = tuple(1.0 / g for _ in members)
        if g > 1:
            base, extra = divmod(c.num_layers, g)
            shares = tuple((base + (1 if s < extra else 0)) / c.num_layers for s in range(g))
        freed_blocks = (g - 1) * c.param_bytes // c.block_bytes
        base_cap = g * c.kv_blocks_per_instance
        unit = _Unit(
            uid=self._uid,
            members=tuple(members),
            shares=shares,
            capacity=base_cap + freed_blocks,
            base_capacity=base_cap,
            formed_at=now,
            last_tick=now,
            dynamic=dynamic,
        )
        # A group's budget is g micro-batches' (a chunk at most one's).
        config = EngineConfig(
            gpu_kv_blocks=unit.capacity,
            cpu_kv_blocks=0,
            block_bytes=c.block_bytes,
            block_size_tokens=c.block_size,
            max_batched_tokens=c.max_batched_tokens * g,
            max_running=c.max_running,
            slo=c.slo,
            max_chunk_tokens=c.max_batched_tokens if g > 1 else None,
            skips_empty_iterations=True,
            records_timeline=False,
        )
        if g > 1:
            unit.core = _GroupCore(unit, self, config, Fcfs())
        else:
            unit.core = BatchingCore(
                config,
                Fcfs(),
                self.cost,
                None,
                self.requests,
                pairs_cost=self.cost,
                tokens=self.tokens,
            )
        self._uid += 1
        self.units.append(unit)
        self._units_by_uid[unit.uid] = unit
        for i in members:
            self.unit_of[i] = unit
        return unit

    def _initial_units(self) -> None:
        n = self.c.instances
        self.unit_of = [None] * n  # type: ignore[list-item]
        if self.rules.static_groups:
            g = self.c.static_group_size
            for start in range(0, n, g):
                self._new_unit(tuple(range(start, min(start + g, n))), 0.0)
        else:
            for i in range(n):
                self._new_unit((i,), 0.0)

    # --- events (planner.replay.cluster_events) ---------------------------------

    def _wake(self, unit: _Unit, now: float) -> None:
        if unit.alive and not unit.scheduled:
            unit.scheduled = True
            self._events.push(UnitSteps(max(now, unit.busy_until), unit.uid))

    def dispatch(self, row: int, now_s: float) -> None:
        self._dispatch(row, now_s)

    def step(self, uid: int, now_s: float) -> None:
        unit = self._units_by_uid[uid]
        if unit.alive:
            unit.scheduled = False
            self._step(unit, now_s)

    def tick(self, now_s: float) -> None:
        self._tick(now_s)
        if self._progress is not None:
            self._progress(now_s)
        self._events.push(MonitorTicks(now_s + self.c.monitor_interval_s))

    def run(self, progress: Callable[[float], None] | None = None) -> ClusterRun:
        started = time.perf_counter()
        c = self.c
        self._initial_units()
        r = self.requests
        rejected = never_fits(r, c.kv_blocks_per_instance, c.block_size)
        r.phase[rejected] = Phase.REJECTED
        self.stats.rejected = int(rejected.sum())
        for row in (~rejected).nonzero()[0].tolist():
            self._pending += 1
            self._events.push(RequestArrives(self.trace[row].arrival_s, row))
        if self._pending:
            self._events.push(MonitorTicks(self.trace[0].arrival_s))
        self._progress = progress
        self._events.run(self, lambda: self._pending <= 0)
        finish = r.finish_s[~np.isnan(r.finish_s)]
        end = float(finish.max()) if len(finish) else 0.0
        for u in self.units:
            if u.alive and u.size > 1 and u.dynamic:
                self.stats.grouped_instance_s += u.size * max(end - u.formed_at, 0.0)
        self.stats.preemptions = int(r.preemptions.sum())
        totals = ReplayTotals(
            iterations=self._iterations,
            simulated_s=end,
            wall_s=time.perf_counter() - started,
            bytes_d2h=0,
            bytes_h2d=0,
            stall_s=0.0,
            preemptions=self.stats.preemptions,
            swap_outs=0,
            swap_ins=0,
            peak_gpu_kv_blocks=max((s.gpu_kv_blocks_used for s in self._timeline), default=0),
            gpu_kv_blocks_total=c.instances * c.kv_blocks_per_instance,
        )
        result = ReplayResult(
            policy=self.policy,
            requests=request_outcomes(r, self.trace, self.tokens, c.slo),
            timeline=self._timeline,
            totals=totals,
        )
        return ClusterRun(result, self.stats)

    # --- dispatch ----------------------------------------------------------------

    def _load(self, unit: _Unit) -> float:
        return unit.demand() / unit.capacity

    def _dispatch(self, row: int, now: float) -> None:
        """Least loaded: among the units whose KV demand leaves room for the
        request, the one with the fewest queued prompt tokens per instance
        (its compute), then the lowest KV demand / capacity; when none has
        room, the lowest KV demand / capacity."""
        r = self.requests
        need = blocks_needed_one(0, int(r.prefill_target[row]), self.c.block_size)

        def key(u: _Unit) -> tuple[int, float, float, int]:
            demand = u.demand()
            if demand + need <= u.capacity:
                queued = int(r.prefill_target[u.waiting].sum())
                return (0, queued / u.size, demand / u.capacity, u.uid)
            return (1, 0.0, demand / u.capacity, u.uid)

        best = min((u for u in self.units if u.alive), key=key)
        best.state.arrive(np.array([row], dtype=np.int64), _NONE)
        self._wake(best, now)

    # --- one iteration (a round for a group) -------------------------------------

    def _check(self, unit: _Unit) -> None:
        free = unit.core.state.free_gpu
        if free < 0 or unit.capacity - free - unit.reserved < 0:
            self.stats.over_capacity += 1

    def _step(self, unit: _Unit, now: float) -> None:
        """The unit's core runs one iteration (a group: one round) from now."""
        core = unit.core
        s = core.state
        core.now_s = now
        finished = s.finished
        batch = core._iteration()
        self._check(unit)
        if not (batch.prefill_tokens or batch.decode_tokens):
            held = s.not_before_s
            if held and len(s.running.rows):  # requests still finishing elsewhere
                unit.busy_until = min(held.values())
                self._wake(unit, now)
            else:
                unit.busy_until = now
            return
        self._iterations += 1
        self._pending -= s.finished - finished
        end = unit.busy_until = core.now_s
        if len(s.running.rows) or len(s.queued.rows):
            # As _wake: the unit is alive and not scheduled (its step is this one).
            unit.scheduled = True
            self._events.push(UnitSteps(end, unit.uid))

    def _round_s(self, unit: _Unit, batch: Batch) -> float:
        """A group's round for the batch: micro-batches balanced by tokens
        (prefill chunks largest first, then decodes, each to the micro-batch
        with the fewest tokens so far; ties: the lowest index), timed as the
        pipeline (_round_time), plus remote attention while victims' KV
        moves, which moves one exchange chunk in the link's idle gap."""
        c = self.c
        r = self.requests
        g = unit.size
        kv = r.kv_tokens
        decode = batch.emitting[: batch.decode_tokens]
        chunks = batch.prefill_chunks.tolist()
        after = kv[batch.prefill_rows].tolist()
        # Each micro-batch: [prefill, decode, context, pairs, tokens].
        m = max(1, min(g, len(decode) + len(chunks)))
        micro = [[0, 0, 0, 0, 0] for _ in range(m)]
        if m == 1:
            mb = micro[0]
            for chunk, kv_after in zip(chunks, after, strict=True):
                mb[0] += chunk
                mb[2] += kv_after
                mb[3] += chunk * (kv_after - chunk) + chunk * (chunk + 1) // 2
            mb[1] = len(decode)
            mb[2] += int(kv[decode].sum())
            mb[4] = mb[0] + mb[1]
        else:
            loads = [(0, k) for k in range(m)]
            for chunk, kv_after in sorted(zip(chunks, after, strict=True), key=lambda x: -x[0]):
                tokens, k = heapq.heappop(loads)
                mb = micro[k]
                mb[0] += chunk
                mb[2] += kv_after
                mb[3] += chunk * (kv_after - chunk) + chunk * (chunk + 1) // 2
                mb[4] += chunk
                heapq.heappush(loads, (tokens + chunk, k))
            for kv_after in kv[decode].tolist():
                tokens, k = heapq.heappop(loads)
                mb = micro[k]
                mb[1] += 1
                mb[2] += kv_after
                mb[4] += 1
                heapq.heappush(loads, (tokens + 1, k))
        batches = [(x[0], x[1], x[2], x[3], x[4]) for x in micro]
        dt = _round_time(self.cost, c, g, batches, unit.shares)
        if unit.exchange_left > 0:
            # Remote attention: victims' activations go to the GPU that still
            # holds their KV and back; the KV moves in the link's idle gap. A
            # victim preempted and admitted again since the merge is not one.
            victims = 0
            if unit.victims:
                admitted = r.admitted_at_s
                victims = sum(
                    1
                    for row in decode.tolist()
                    if row in unit.victims and admitted[row] <= unit.formed_at
                )
            ra = 2 * victims * c.hidden_size * ACTIVATION_BYTES / c.link_bytes_per_s
            hops = (g - 1) * max(mb[4] for mb in micro) * c.hidden_size * ACTIVATION_BYTES
            gap = max(dt - hops / c.link_bytes_per_s, 0.0)
            dt += ra
            chunk_bytes = exchange_chunk_bytes(c.link_gbps, gap, c.block_bytes)
            moved = min(float(chunk_bytes), unit.exchange_left)
            unit.exchange_left -= moved
            self.stats.exchange_bytes += int(moved)
            if unit.exchange_left <= 0:
                unit.exchange_left = 0.0
                unit.victims.clear()
        return dt

    # --- monitor tick: policies' control -----------------------------------------

    def _tick(self, now: float) -> None:
        alive = [u for u in self.units if u.alive]
        self._timeline.append(
            TimelineSample(
                time_s=now,
                iteration_s=0.0,
                stall_s=0.0,
                gpu_kv_blocks_used=sum(u.used for u in alive),
                cpu_kv_blocks_used=0,
                running=sum(len(u.running) for u in alive),
                waiting=sum(len(u.waiting) for u in alive),
                rotary=0,
                prefill_tokens=0,
                decode_tokens=0,
            )
        )
        if now > self._last_arrival + NO_PROGRESS_S:
            raise RuntimeError(f"cluster replay made no progress by {now:.0f} s (a bug)")
        for u in alive:
            if len(u.waiting) or len(u.running):
                self._wake(u, now)
        if self.rules.buddy_groups:
            self._kunserve_tick(now)
        self._balance_queues(now)
        if self.rules.migrates_kv:
            self._start_migrations(now)

    def _blocked(self, u: _Unit) -> bool:
        """Its queue's head does not fit (the core admits in queue order)."""
        waiting = u.waiting
        return bool(len(waiting)) and int(self.requests.start_blocks[waiting[0]]) > u.free()

    def _balance_queues(self, now: float) -> None:
        start_blocks = self.requests.start_blocks
        for src in [u for u in self.units if u.alive]:
            while self._blocked(src) and len(src.waiting) > 0:
                row = int(src.waiting[-1])  # the tail: the head keeps its place
                need = int(start_blocks[row])
                dsts = [
                    u
                    for u in self.units
                    if u.alive and u is not src and not len(u.waiting) and u.free() >= need
                ]
                if not dsts:
                    break
                dst = min(dsts, key=lambda u: (self._load(u), u.uid))
                src.state.hand_over(np.array([row], dtype=np.int64), dst.state)
                self.stats.queue_moves += 1
                self._wake(dst, now)
                if len(src.waiting) == 1:
                    break

    def _start_migrations(self, now: float) -> None:
        c = self.c
        r = self.requests
        for src in [u for u in self.units if u.alive]:
            if src.migrating_out or not self._blocked(src):
                continue
            running = src.running
            cands = running[r.kv_tokens[running] >= r.prefill_target[running]]
            if src.state.pinned:
                cands = cands[~np.isin(cands, list(src.state.pinned))]
            if not len(cands):
                continue
            # The smallest, then the earliest admitted.
            row = int(cands[np.lexsort((cands, r.admitted_at_s[cands], r.gpu_blocks[cands]))[0]])
            blocks = int(r.gpu_blocks[row])
            # Llumnix moves to a clearly less loaded instance (no ping-pong).
            dsts = [
                u
                for u in self.units
                if u.alive
                and u is not src
                and u.free() >= blocks + 1
                and not self._blocked(u)
                and self._load(u) + MIGRATION_MARGIN < self._load(src)
            ]
            if not dsts:
                continue
            dst = max(dsts, key=lambda u: (u.free(), -u.uid))
            nbytes = blocks * c.block_bytes
            dst.reserved += blocks + 1
            dst.state.resize_gpu(-(blocks + 1))
            src.state.pinned.add(row)
            src.migrating_out = True
            self._check(dst)
            key = self._migrations
            self._migrations += 1
            self._mig_state[key] = (row, src, dst, blocks + 1)
            self._events.push(MigrationEnds(now + nbytes / c.link_bytes_per_s, key))

    def finish_migration(self, migration: int, now_s: float) -> None:
        row, src, dst, reserved = self._mig_state.pop(migration)
        r = self.requests
        src.migrating_out = False
        dst.reserved -= reserved
        dst.state.resize_gpu(reserved)
        src.state.pinned.discard(row)
        if r.phase[row] != Phase.RUNNING or row not in src.running:
            return
        blocks = int(r.gpu_blocks[row])
        if dst.free() < blocks:
            return  # it grew past the reservation: stays
        src.state.hand_over(np.array([row], dtype=np.int64), dst.state)
        # Its last token may come at the end of the source's iteration.
        last = float(r.last_token_s[row])
        if last > now_s:
            dst.state.not_before_s[row] = last
        self.stats.migrations += 1
        self.stats.migrated_bytes += blocks * self.c.block_bytes
        self._check(src)
        self._check(dst)
        self._wake(dst, now_s)
        self._wake(src, now_s)

    # --- KunServe: drop and restore ------------------------------------------------

    def _kunserve_tick(self, now: float) -> None:
        c = self.c
        singles = [u for u in self.units if u.alive and u.size == 1]
        decisions = []
        for u in singles:
            i = u.members[0]
            mon = self.monitors.setdefault(i, InstanceMonitor(str(i)))
            demand = u.demand() * c.block_bytes
            capacity = u.capacity * c.block_bytes
            decisions.append((u, mon.observe(now, demand, capacity, c.trigger), demand))
        if any(d.drop for _, d, _ in decisions) and len(singles) > 1:
            required = sum(d.shortfall_bytes for _, d, _ in decisions if d.drop)
            required = max(required, 1)
            inputs = ClusterInputs(
                instances=tuple(
                    Instance(
                        id=str(u.members[0]),
                        kv_capacity_bytes=u.capacity * c.block_bytes,
                        kv_demand_bytes=demand,
                    )
                    for u, _, demand in decisions
                ),
                param_bytes=c.param_bytes,
                num_layers=c.num_layers,
                profile=self.profile,
                required_bytes=required,
                strategy=Strategy.THROUGHPUT_GREEDY,
            )
            plan = plan_buddy_groups(inputs)
            merged = [g for g in plan.groups if g.size > 1]
            if merged:
                self.stats.drops += 1
                self.stats.events.append(
                    f"{now:.2f}s drop: groups of "
                    + ",".join(str(g.size) for g in merged)
                    + f" for {required / 1e9:.1f} GB"
                )
                for g in merged:
                    self._merge([int(m.instance_id) for m in g.members], now)
        for u in [u for u in self.units if u.alive and u.size > 1 and u.dynamic]:
            if u.restoring_until is not None or u.exchange_left > 0:
                continue
            used_bytes = u.demand() * c.block_bytes
            dt = now - u.last_tick
            used = u.used
            rate = (used - u.last_used) * c.block_bytes / dt if dt > 0 else 0.0
            u.last_used, u.last_tick = used, now
            decision = u.restore_monitor.observe(
                now, used_bytes, u.base_capacity * c.block_bytes, c.restore, rate
            )
            if decision.restore:
                self._start_restore(u, now)

    def _merge(self, members: list[int], now: float) -> None:
        c = self.c
        kv = self.requests.kv_tokens
        old = [self.unit_of[i] for i in members]
        unit = self._new_unit(members, now, dynamic=True)
        unit.busy_until = max(u.busy_until for u in old)
        # KV of the layers each member dropped moves to the stage holding them.
        moves = []
        for o, share, i in zip(old, unit.shares, members, strict=True):
            o.alive = False
            self.monitors.pop(i, None)
            running = o.running
            moves.append(int(kv[running].sum()) * c.kv_bytes_per_token * (1 - share))
            unit.victims.update(running.tolist())
            o.state.hand_over(running, unit.state)
            o.state.hand_over(o.waiting, unit.state)
        unit.exchange_left = max(moves, default=0.0)
        unit.state.order_running_by_admission()
        # The queue in arrival order (rows are in arrival order).
        unit.state.queued.rows = np.sort(unit.waiting)
        self.stats.groups_formed += 1
        self.stats.max_merged_instances = max(self.stats.max_merged_instances, len(members))
        self._check(unit)
        self._wake(unit, now)

    def _start_restore(self, u: _Unit, now: float) -> None:
        c = self.c
        if u.used + u.reserved > u.base_capacity:
            return
        u.state.resize_gpu(u.base_capacity - u.capacity)
        u.capacity = u.base_capacity
        reload_bytes = (u.size - 1) * c.param_bytes  # spread over the members' links
        per_member = reload_bytes / u.size
        kv_bytes = int(self.requests.kv_tokens[u.running].sum()) * c.kv_bytes_per_token
        duration = max(per_member / (c.reload_gbps * 1e9), kv_bytes / u.size / c.link_bytes_per_s)
        u.restoring_until = now + duration
        self.stats.reload_bytes += int(reload_bytes)
        self._check(u)
        self._events.push(RestoreEnds(now + duration, u.uid))

    def finish_restore(self, uid: int, now_s: float) -> None:
        u = self._units_by_uid[uid]
        if not u.alive:
            return
        r = self.requests
        u.alive = False
        self.stats.restores += 1
        self.stats.grouped_instance_s += u.size * (now_s - u.formed_at)
        self.stats.events.append(f"{now_s:.2f}s restore: group of {u.size}")
        singles = [self._new_unit((i,), now_s) for i in u.members]
        for s in singles:
            s.busy_until = u.busy_until
        # First-fit decreasing by blocks onto the member with the most room;
        # one that fits nowhere is preempted (recompute) to that member's queue.
        running = u.running
        order = running[np.lexsort((running, r.admitted_at_s[running], -r.gpu_blocks[running]))]
        queued = u.waiting
        for row in order.tolist():
            one = np.array([row], dtype=np.int64)
            dst = max(singles, key=lambda s: (s.free(), -s.uid))
            if dst.free() >= int(r.gpu_blocks[row]):
                u.state.hand_over(one, dst.state)
            else:
                u.state.preempt([row], swap=False)
                u.state.hand_over(one, dst.state, front=True)
        for s in singles:
            s.state.order_running_by_admission()
        for row in queued.tolist():
            dst = min(singles, key=lambda s: (self._load(s), s.uid))
            u.state.hand_over(np.array([row], dtype=np.int64), dst.state)
        for s in singles:
            self._check(s)
            self._wake(s, now_s)
