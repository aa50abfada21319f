"""The serverless topology (issue 7, C2CServe): one GH200 split into MIG
slices that share one NVLink-C2C link, many models with per-model arrivals.

Every model has the architecture of the replay profile's model (its weights
are a distinct copy, as fine-tunes of one base are). A slice serves one
model at a time; its requests are batched Sarathi-style: each iteration runs
one prefill chunk of the oldest unprefilled request plus one decode token of
every running one, timed by the C2C cost model
(:func:`planner.profiles.c2c_cost.model_pass_cost`).

Policies:

- ``c2cserve``: weights stay in CPU memory and stream over C2C. Routing is
  the landed :func:`route_request` (active slice, idle slice within the link
  budget W/TPOT, evict an inactive model, else queue); every ``replan_s`` the
  landed greedy :func:`plan_placement` over the models with recent arrivals
  (weight = arrivals) sets up idle slices ahead of demand; the chunk comes
  from :func:`choose_chunk` on :func:`chunk_table`, the kernel family from
  :func:`choose_kernel`, and rho from one :class:`RhoTuner` per slice fed
  every iteration's latency and utilizations (restarted on a switch). A
  switch costs ``switch_setup_s`` (engine setup, no weight load).
- ``dedicated``: weights are loaded into the slice's HBM on each model
  switch: cold start = weight bytes / the load link's bandwidth (PCIe or
  C2C); iterations read weights from HBM (the weight stream is timed at the
  slice's HBM bandwidth); fixed chunk ``static_chunk``; LRU eviction of an
  inactive slice; no link budget.
- ``random``: c2cserve's streaming, chunk, kernel and tuner, but a model
  without an active slice goes to a slice drawn (seeded) among those idle or
  inactive, ignoring the link budget.
- ``static-chunk``: c2cserve with every chunk ``static_chunk`` tokens.
- ``static-rho``: c2cserve with rho fixed at the cost model's best static rho
  on an uncontended link (per pass shape), no tuner.

Link sharing: an iteration that starts while k - 1 other slices are streaming
gets 1/k of the link's sustained bandwidth (fair share at its start); its
rate (C2C bytes / its time) is what the others see. Link utilization is the
C2C bytes moved (streams and, for ``dedicated`` over C2C, loads) over the
sustained bandwidth times the simulated span.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from planner.domain.requests import Slo
from planner.domain.serverless import MigSlice, PlacementParams, ServerlessModel, SliceState
from planner.policies.serverless import (
    ACTIVE,
    EVICT,
    IDLE,
    KnobObservation,
    RhoTuner,
    choose_chunk,
    choose_kernel,
    plan_placement,
    route_request,
)
from planner.profiles.c2c_cost import GemmTiles, best_static_rho, chunk_table, model_pass_cost
from planner.profiles.mig import GB, MigSliceProfile
from planner.profiles.models import ModelProfile
from planner.replay.records import ReplayResult, ReplayTotals, RequestOutcome
from planner.trace.records import TraceRequest

C2CSERVE = "c2cserve"
DEDICATED = "dedicated"
RANDOM = "random"
STATIC_CHUNK = "static-chunk"
STATIC_RHO = "static-rho"
SERVERLESS_POLICY_NAMES = (C2CSERVE, DEDICATED, RANDOM, STATIC_CHUNK, STATIC_RHO)
DEFAULT_MODEL = "default"


@dataclass(frozen=True, slots=True)
class ServerlessConfig:
    slices: tuple[MigSliceProfile, ...]
    # The architecture of every model.
    model: ModelProfile
    # Sustained host-to-device C2C bandwidth shared by all slices, GB/s.
    link_gbps: float
    # dedicated: the link weights are loaded over ("pcie" or "c2c") and its GB/s.
    load_link: str
    load_gbps: float
    slo: Slo
    # c2cserve/random/static-*: engine setup on a model switch, s.
    switch_setup_s: float = 0.05
    static_chunk: int = 2048
    max_running: int = 64
    replan_s: float = 10.0
    seed: int = 0
    precision: str = "bf16"

    def check(self) -> None:
        if not self.slices:
            raise ValueError("no MIG slice")
        for name in ("link_gbps", "load_gbps", "replan_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {v}")
        if not (math.isfinite(self.switch_setup_s) and self.switch_setup_s >= 0):
            raise ValueError(f"switch_setup_s must be >= 0, got {self.switch_setup_s}")
        if self.static_chunk <= 0 or self.max_running <= 0:
            raise ValueError("static_chunk and max_running must be > 0")
        if self.model.param_bytes <= 0:
            raise ValueError(f"model {self.model.name} has no parameter bytes")


@dataclass(frozen=True, slots=True)
class SwitchRecord:
    time_s: float
    slice_id: str
    from_model: str
    to_model: str
    # From the switch decision until the slice can run the new model.
    latency_s: float
    # Bytes loaded (dedicated) or 0.
    load_bytes: float


@dataclass(frozen=True, slots=True)
class ServerlessStats:
    switches: int
    switch_latency_s: tuple[float, ...]
    c2c_bytes: float
    load_bytes: float
    link_gbps: float
    span_s: float
    iterations: int
    replans: int
    queued: int
    mean_rho: float | None
    models: int

    @property
    def link_utilization(self) -> float | None:
        if self.span_s <= 0:
            return None
        return self.c2c_bytes / (self.link_gbps * GB * self.span_s)


@dataclass(slots=True)
class ServerlessRun:
    result: ReplayResult
    stats: ServerlessStats
    switches: list[SwitchRecord]


@dataclass(slots=True)
class _Req:
    out: RequestOutcome
    model: str
    prefilled: int = 0
    chunk: int = 0


@dataclass(slots=True)
class _Slice:
    index: int
    id: str
    profile: MigSliceProfile
    model: str = ""
    ready_s: float = 0.0
    busy: bool = False
    rate_gbps: float = 0.0
    last_used_s: float = 0.0
    queue: deque[_Req] = field(default_factory=deque)
    running: list[_Req] = field(default_factory=list)
    tuner: RhoTuner | None = None

    @property
    def in_flight(self) -> int:
        return len(self.queue) + len(self.running)


class ServerlessEngine:
    def __init__(self, config: ServerlessConfig, policy: str, trace: list[TraceRequest]) -> None:
        config.check()
        if policy not in SERVERLESS_POLICY_NAMES:
            raise ValueError(f"unknown serverless policy {policy!r}")
        self.config = config
        self.policy = policy
        self.trace = trace
        self._rng = np.random.default_rng(config.seed)
        self._slices = [_Slice(i, f"mig{i}", p) for i, p in enumerate(config.slices)]
        self._weight_bytes = float(config.model.param_bytes)
        self._tpot = config.slo.tbt_s
        self._cache_chunk: dict[tuple[str, int], int] = {}
        self._cache_tiles: dict[tuple[str, bool], GemmTiles] = {}
        self._cache_rho: dict[tuple[str, bool], float] = {}
        self._rhos: list[float] = []
        self._budget = PlacementParams(link_gbps=config.link_gbps).link_budget_gbps
        self._events: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self._pending: deque[_Req] = deque()
        self._switches: list[SwitchRecord] = []
        self._c2c_bytes = 0.0
        self._load_bytes = 0.0
        self._iterations = 0
        self._replans = 0
        self._last = 0.0

    # -- policy pieces -------------------------------------------------
    @property
    def _streams(self) -> bool:
        return self.policy != DEDICATED

    def _serverless_model(self, name: str, weight: float = 1.0) -> ServerlessModel:
        return ServerlessModel(name, int(self._weight_bytes), self._tpot, weight=weight)

    def _tiles(self, s: _Slice, tokens: int) -> GemmTiles:
        key = (s.profile.name, tokens <= 64)
        if key not in self._cache_tiles:
            k = choose_kernel(precision=self.config.precision, tokens=tokens, mig=s.profile)
            self._cache_tiles[key] = GemmTiles(k.sym_block_m, k.block_n, k.asym_block_k)
        return self._cache_tiles[key]

    def _chunk(self, s: _Slice, prompt: int) -> int:
        if self.policy in (DEDICATED, STATIC_CHUNK):
            return self.config.static_chunk
        bucket = 1 << max(0, math.ceil(math.log2(max(prompt, 1))))
        key = (s.profile.name, bucket)
        if key not in self._cache_chunk:
            share = self.config.link_gbps / len(self._slices)
            table = chunk_table(
                self.config.model,
                s.profile,
                prompt_tokens=bucket,
                c2c_gbps=share,
                tiles=self._tiles(s, 4096),
            )
            choice = choose_chunk(table, ttft_target_s=self.config.slo.ttft_s, mig=s.profile)
            self._cache_chunk[key] = choice.chunk_tokens
        return self._cache_chunk[key]

    def _rho(self, s: _Slice, tokens: int) -> float:
        if self.policy == DEDICATED:
            return 0.0
        if self.policy == STATIC_RHO:
            key = (s.profile.name, tokens <= 64)
            if key not in self._cache_rho:
                probe = 8 if key[1] else self.config.static_chunk
                self._cache_rho[key] = best_static_rho(
                    self.config.model,
                    probe,
                    mig=s.profile,
                    c2c_gbps=self.config.link_gbps,
                    tiles=self._tiles(s, probe),
                )
            return self._cache_rho[key]
        assert s.tuner is not None
        return s.tuner.state.rho

    def _states(self, now: float) -> list[SliceState]:
        c2c = self._serverless_model("x").c2c_gbps
        return [
            SliceState(
                s.id,
                s.profile,
                model=s.model,
                model_c2c_gbps=c2c if s.model else 0.0,
                model_priority=1.0,
                in_flight=s.in_flight,
                last_used_s=s.last_used_s,
            )
            for s in self._slices
        ]

    def _route(self, model: str, now: float) -> _Slice | None:
        """The slice a request for ``model`` goes to (switching it when its
        model differs), or None: wait."""
        slices = self._slices
        active = [s for s in slices if s.model == model]
        if self.policy in (C2CSERVE, STATIC_CHUNK, STATIC_RHO):
            d = route_request(
                self._serverless_model(model),
                self._states(now),
                priority=1.0,
                link_budget_gbps=self._budget,
                allow_preempt=False,
            )
            if d.action == ACTIVE:
                return next(s for s in slices if s.id == d.slice_id)
            if d.action in (IDLE, EVICT):
                target = next(s for s in slices if s.id == d.slice_id)
                self._switch(target, model, now)
                return target
            return None
        if active:
            return min(active, key=lambda s: (s.in_flight, s.index))
        free = [s for s in slices if s.in_flight == 0 and not s.busy]
        if self.policy == DEDICATED:
            free = [s for s in free if s.profile.hbm_bytes >= self._weight_bytes]
            if not free:
                return None
            empty = [s for s in free if not s.model]
            target = empty[0] if empty else min(free, key=lambda s: (s.last_used_s, s.index))
        else:
            if not free:
                return None
            target = free[int(self._rng.integers(len(free)))]
        self._switch(target, model, now)
        return target

    def _switch(self, s: _Slice, model: str, now: float) -> None:
        if self.policy == DEDICATED:
            latency = self._weight_bytes / (self.config.load_gbps * GB)
            loaded = self._weight_bytes
            if self.config.load_link == "c2c":
                self._c2c_bytes += loaded
            self._load_bytes += loaded
        else:
            latency = self.config.switch_setup_s
            loaded = 0.0
        self._switches.append(SwitchRecord(now, s.id, s.model, model, latency, loaded))
        s.model = model
        s.ready_s = max(s.ready_s, now) + latency
        s.tuner = RhoTuner() if self.policy not in (DEDICATED, STATIC_RHO) else None
        s.last_used_s = now

    # -- simulation ----------------------------------------------------
    def _push(self, t: float, kind: int, index: int) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, kind, self._seq, index))

    def _kick(self, s: _Slice, now: float) -> None:
        if not s.busy and s.in_flight:
            s.busy = True
            self._push(max(now, s.ready_s), 1, s.index)

    def _drain(self, now: float) -> None:
        """Route waiting requests in arrival order; once a model finds no
        slice, its later requests wait too (no overtaking within a model)."""
        if not self._pending:
            return
        free = any(s.in_flight == 0 for s in self._slices)
        active = {s.model for s in self._slices if s.model}
        failed: set[str] = set()
        kept: deque[_Req] = deque()
        for r in self._pending:
            if r.model in failed or (not free and r.model not in active):
                kept.append(r)
                continue
            s = self._route(r.model, now)
            if s is None:
                failed.add(r.model)
                kept.append(r)
                continue
            s.queue.append(r)
            self._kick(s, now)
            active.add(s.model)
            free = any(o.in_flight == 0 for o in self._slices)
        self._pending = kept

    def _iterate(self, s: _Slice, now: float) -> None:
        cfg = self.config
        if now < s.ready_s:
            self._push(s.ready_s, 1, s.index)
            return
        head = s.queue[0] if s.queue and len(s.running) < cfg.max_running else None
        decodes = s.running
        chunk = 0
        if head is not None:
            if head.chunk == 0:
                head.chunk = self._chunk(s, head.out.prompt_tokens)
            chunk = min(head.chunk, head.out.prompt_tokens - head.prefilled)
        tokens = chunk + len(decodes)
        if tokens == 0:
            s.busy = False
            s.rate_gbps = 0.0
            self._drain(now)
            return
        context = sum(r.out.prompt_tokens + len(r.out.token_times_s) for r in decodes)
        start = head.prefilled if head is not None else 0
        pairs = float(context) + chunk * (start + chunk / 2.0)
        rho = self._rho(s, tokens)
        tiles = self._tiles(s, tokens)
        if self._streams:
            others = [o for o in self._slices if o is not s and o.rate_gbps > 0]
            share = cfg.link_gbps / (1 + len(others))
        else:
            others = []
            share = s.profile.hbm_bytes_per_s / GB
        cost = model_pass_cost(
            cfg.model,
            tokens,
            rho=rho,
            mig=s.profile,
            c2c_gbps=share,
            attended_pairs=pairs,
            kv_read_tokens=float(context + start),
            tiles=tiles,
        )
        dt = cost.time_s
        if self._streams:
            s.rate_gbps = cost.c2c_bytes / dt / GB
            self._c2c_bytes += cost.c2c_bytes
            self._rhos.append(rho)
            if s.tuner is not None:
                u_c2c = min(1.0, (s.rate_gbps + sum(o.rate_gbps for o in others)) / cfg.link_gbps)
                u_hbm = min(1.0, cost.hbm_bytes / dt / s.profile.hbm_bytes_per_s)
                s.tuner.observe(
                    KnobObservation(
                        now_s=now + dt,
                        latency_s=dt,
                        latency_budget_s=cfg.slo.tbt_s,
                        hbm_util=u_hbm,
                        c2c_util=u_c2c,
                    )
                )
        self._iterations += 1
        end = now + dt
        s.last_used_s = end
        still: list[_Req] = []
        for r in decodes:
            r.out.token_times_s.append(end)
            if len(r.out.token_times_s) >= r.out.output_tokens:
                r.out.finish_s = end
            else:
                still.append(r)
        s.running = still
        if head is not None:
            head.prefilled += chunk
            if head.prefilled >= head.out.prompt_tokens:
                s.queue.popleft()
                head.out.token_times_s.append(end)
                if head.out.output_tokens <= 1:
                    head.out.finish_s = end
                else:
                    s.running.append(head)
        self._last = max(self._last, end)
        self._push(end, 1, s.index)

    def _replan(self, now: float, window: list[str]) -> None:
        counts: dict[str, int] = {}
        for m in window:
            counts[m] = counts.get(m, 0) + 1
        if not counts:
            return
        models = [self._serverless_model(m, float(c)) for m, c in sorted(counts.items())]
        slices = [MigSlice(s.id, s.profile) for s in self._slices]
        plan = plan_placement(
            models, slices, PlacementParams(link_gbps=self.config.link_gbps, method="greedy")
        )
        self._replans += 1
        by_id = {s.id: s for s in self._slices}
        active = {s.model for s in self._slices if s.model}
        for a in plan.assignments:
            s = by_id[a.slice_id]
            if a.model in active or s.in_flight or s.busy:
                continue
            budget_ok = (
                sum(1 for o in self._slices if o.model and o is not s) + 1
            ) * self._serverless_model(a.model).c2c_gbps <= self._budget * (1 + 1e-9)
            if not s.model and budget_ok:
                self._switch(s, a.model, now)
                active.add(a.model)

    def run(self, progress: Callable[[float], None] | None = None) -> ServerlessRun:
        cfg = self.config
        wall = time.perf_counter()
        if self._events or self._iterations:
            raise RuntimeError("a ServerlessEngine runs once")
        queued = 0
        reqs: list[_Req] = []
        for i, t in enumerate(self.trace):
            out = RequestOutcome(
                id=t.id if t.id is not None else str(i),
                arrival_s=t.arrival_s,
                prompt_tokens=max(1, t.prompt_tokens),
                output_tokens=max(1, t.output_tokens),
                slo_ttft_s=t.slo_ttft_s if t.slo_ttft_s is not None else cfg.slo.ttft_s,
                slo_tbt_s=t.slo_tbt_s if t.slo_tbt_s is not None else cfg.slo.tbt_s,
            )
            reqs.append(_Req(out, t.model or DEFAULT_MODEL))
            self._push(t.arrival_s, 0, i)
        replan_at = 0.0
        window: list[str] = []
        while self._events:
            now, kind, _, index = heapq.heappop(self._events)
            if kind == 0:
                r = reqs[index]
                self._last = max(self._last, now)
                window.append(r.model)
                if self.policy == C2CSERVE and now >= replan_at:
                    self._replan(now, window)
                    window = []
                    replan_at = now + cfg.replan_s
                # A request of an active model joins its slice; any other
                # waits behind the earlier waiting requests.
                waiting = any(p.model == r.model for p in self._pending)
                s = None
                if not waiting and any(o.model == r.model for o in self._slices):
                    s = self._route(r.model, now)
                if s is None:
                    queued += 1
                    self._pending.append(r)
                    self._drain(now)
                else:
                    s.queue.append(r)
                    self._kick(s, now)
                if progress is not None:
                    progress(now)
            else:
                self._iterate(self._slices[index], now)
        outcomes = [r.out for r in reqs]
        first = min((r.arrival_s for r in outcomes), default=0.0)
        span = max(0.0, self._last - first)
        wall_s = time.perf_counter() - wall
        result = ReplayResult(
            policy=self.policy,
            requests=outcomes,
            timeline=[],
            totals=ReplayTotals(
                iterations=self._iterations,
                simulated_s=span,
                wall_s=wall_s,
                bytes_d2h=0,
                bytes_h2d=int(self._c2c_bytes + self._load_bytes),
                stall_s=0.0,
                preemptions=0,
                swap_outs=0,
                swap_ins=0,
                peak_gpu_kv_blocks=0,
                gpu_kv_blocks_total=0,
            ),
        )
        stats = ServerlessStats(
            switches=len(self._switches),
            switch_latency_s=tuple(w.latency_s for w in self._switches),
            c2c_bytes=self._c2c_bytes,
            load_bytes=self._load_bytes,
            link_gbps=cfg.link_gbps,
            span_s=span,
            iterations=self._iterations,
            replans=self._replans,
            queued=queued,
            mean_rho=float(np.mean(self._rhos)) if self._rhos else None,
            models=len({r.model for r in reqs}),
        )
        return ServerlessRun(result, stats, self._switches)
