"""The serverless topology (C2CServe): one GH200 split into MIG slices that
share one NVLink-C2C link, many models with per-model arrivals.

Every model has the architecture of the replay profile's model (its weights
are a distinct copy, as fine-tunes of one base are). A slice runs one model
at a time and batches that model's requests Sarathi-style: each iteration
runs one prefill chunk of the first placed request plus one decode token of
every running one, timed by the C2C cost model
(:func:`planner.profiles.c2c_cost.model_pass_cost`). What each policy does
is in :mod:`planner.replay.serverless_policies`.

Requests wait in one queue, oldest first (their arrival, or when they were
preempted). The waiting models are scheduled by the policy function
:func:`planner.policies.serverless.schedule_waiting` on every arrival, when a
slice goes inactive, and at an iteration boundary whenever a preemption may
be due; a model handed a slice takes all its waiting requests there, where
they batch.

- Preemption: the evicted model's requests leave when its iteration in
  progress ends; their KV moves to host memory over the link (device to
  host, full bandwidth) and they wait again from then, keeping their
  progress; placed again, their KV moves back before they run.
- KV capacity: a slice holds the KV tokens its HBM leaves
  (:func:`planner.profiles.c2c_cost.kv_capacity_tokens`: weights too for the
  HBM-resident baselines). A prefill starts only when its chunk fits; when
  the decodes' growth does not fit, the youngest running request's KV moves
  to host memory and it waits at the front of the slice's queue. A request
  whose KV cannot fit an empty slice is rejected (left unfinished).
- Switches: streaming policies pay engine set-up (``switch_setup_s``);
  HBM-resident baselines load the weights over their load link, shared
  fairly by the loads in flight (:class:`SharedLink`), then pay their engine
  work (``planner.profiles.switch_costs``).
- Noise (``jitter_cv``, ``seed``): every iteration's modelled time is
  multiplied by the next factor of planner.replay.noise's seeded lognormal
  stream, one stream per run (the link rate it reports and the rho tuner's
  latency see the noisy time).
- Link sharing of streams: an iteration that starts while k - 1 other
  slices are streaming gets 1/k of the link's sustained bandwidth; its rate
  (C2C bytes / its time) is what the others see. Link utilization is the
  C2C bytes moved (streams, KV moved in, and loads over C2C) over the
  sustained bandwidth times the simulated span.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from planner.domain.requests import Slo
from planner.domain.serverless import (
    MigSlice,
    PlacementParams,
    PreemptionParams,
    RouteDecision,
    ScheduledRoute,
    ServerlessModel,
    SliceState,
    WaitingModel,
)
from planner.policies.serverless import (
    ACTIVE,
    EVICT,
    GIVE_UP,
    IDLE,
    QUEUE,
    SHARE,
    KnobObservation,
    RhoTuner,
    Sharer,
    choose_chunk,
    choose_kernel,
    end_share,
    eviction_order,
    plan_placement,
    resident_split,
    schedule_waiting,
    service_order,
    starvation_bound_s,
)
from planner.policies.serverless.placement import fits
from planner.profiles.c2c_cost import (
    DEFAULT_MEMORY_UTILIZATION,
    RUNTIME_RESERVE_BYTES,
    GemmTiles,
    ModelPass,
    best_static_rho,
    chunk_table,
    kv_capacity_tokens,
)
from planner.profiles.mig import GB, MigSliceProfile
from planner.profiles.models import ModelProfile
from planner.replay.batching_core import BatchingCore, EngineConfig, request_outcomes
from planner.replay.events import EventLoop
from planner.replay.model_residency import ModelResidency, Pass, Turn
from planner.replay.noise import JitterFactors
from planner.replay.records import ReplayResult, ReplayTotals
from planner.replay.serverless_events import (
    DrainLimit,
    LoadsDone,
    LoadStarts,
    ReadsDone,
    RequestArrives,
    ServerlessWiring,
    ShareBoundEnds,
    SliceIterates,
)
from planner.replay.serverless_link import SharedLink
from planner.replay.serverless_policies import (
    AEGAEON,
    BEST_STATIC,
    C2CSERVE,
    C2CSERVE_CHUNKED,
    C2CSERVE_EXCLUSIVE,
    C2CSERVE_INACTIVE,
    C2CSERVE_KV_CAP,
    C2CSERVE_KV_FIRST,
    C2CSERVE_LIGHT_SHARE,
    C2CSERVE_PARTIAL,
    C2CSERVE_STICKY_SHARE,
    C2CSERVE_STREAM,
    DEDICATED,
    KV_TAKES_WEIGHTS_WHEN_ALONE,
    KV_TAKES_WEIGHTS_WHEN_FASTER,
    RANDOM,
    RANDOM_PLACEMENT,
    SERVERLESS_POLICIES,
    SERVERLESS_POLICY_NAMES,
    SLLM,
    STATIC,
    STATIC_CHUNK,
    STATIC_RHO,
    TUNER,
    ServerlessPolicy,
)
from planner.replay.serverless_slices import (
    NOBODY,
    Resident,
    Slice,
    SlicedRequest,
    wait_key,
)
from planner.replay.serverless_timeline import SliceTimeline
from planner.replay.state import RequestColumns
from planner.replay.tokens import TokenTimes
from planner.trace.records import TraceRequest

__all__ = [
    "AEGAEON",
    "C2CSERVE",
    "C2CSERVE_CHUNKED",
    "C2CSERVE_EXCLUSIVE",
    "C2CSERVE_INACTIVE",
    "C2CSERVE_KV_CAP",
    "C2CSERVE_KV_FIRST",
    "C2CSERVE_LIGHT_SHARE",
    "C2CSERVE_PARTIAL",
    "C2CSERVE_STICKY_SHARE",
    "C2CSERVE_STREAM",
    "DEDICATED",
    "DEFAULT_MODEL",
    "RANDOM",
    "SERVERLESS_POLICY_NAMES",
    "SLLM",
    "STATIC_CHUNK",
    "STATIC_RHO",
    "ServerlessConfig",
    "ServerlessEngine",
    "ServerlessRun",
    "ServerlessStats",
    "SwitchRecord",
]

DEFAULT_MODEL = "default"
LOAD_LINKS = ("pcie", "c2c")
# Preemption for a 5 s TTFT target (serverless_setup derives it from the SLO).
DEFAULT_PREEMPTION = PreemptionParams(
    min_hold_s=2.5, urgent_slack_s=2.5, victim_slack_s=40.0, starve_after_s=60.0
)
# The least copy that tops a model's resident weights up.
MIN_TOP_UP_BYTES = 1e9
# A slice's batching core: KV counted in tokens (one-token blocks) in pools
# that never limit (the slice's KV room is model residency's), no token
# budget or running cap of its own, no copies timed by a link (KV moves
# delay the requests that move), iterations timed by model residency.
_UNBOUNDED = 2**62
_SLICE_CORE = EngineConfig(
    gpu_kv_blocks=_UNBOUNDED,
    cpu_kv_blocks=_UNBOUNDED,
    block_bytes=0,
    block_size_tokens=1,
    max_batched_tokens=_UNBOUNDED,
    max_running=_UNBOUNDED,
    skips_empty_iterations=True,
    records_timeline=False,
)


class _NoCompute:
    """The slice core's cost model: model residency times every pass."""

    def iteration_time_s(
        self, prefill_tokens: int, decode_tokens: int, context_tokens: int
    ) -> float:
        return 0.0


_NO_COMPUTE = _NoCompute()


@dataclass(frozen=True, slots=True)
class ServerlessConfig:
    slices: tuple[MigSliceProfile, ...]
    # The architecture of every model.
    model: ModelProfile
    # Sustained host-to-device C2C bandwidth shared by all slices, GB/s.
    link_gbps: float
    slo: Slo
    # The HBM-resident baselines' weight-load link ("pcie" or "c2c"; None:
    # each policy's default) and PCIe's bandwidth, GB/s.
    load_link: str | None = None
    pcie_gbps: float = 55.0
    # Streaming policies: engine set-up on a model switch, s.
    switch_setup_s: float = 0.05
    # When a waiting model may preempt (policies that preempt).
    preemption: PreemptionParams = DEFAULT_PREEMPTION
    # Models resident on one slice at once, taking turns (policies that
    # share; the HBM-resident baselines hold one).
    max_models_per_slice: int = 2
    # Policies that keep weights resident: KV tokens each model on a slice
    # keeps room for before weights take the rest of the HBM.
    kv_reserve_tokens: int = 16384
    # Policies that share only light slices: the most requests in flight on
    # a slice (all its residents) for a model to join it; above it a shared
    # slice sheds residents.
    share_max_in_flight: int = 2
    # Policies that end shares: how often, in simulated seconds, a slice two
    # busy models share weighs ending it (``end_share``), and the margin
    # by which ending it must win.
    share_check_s: float = 1.0
    share_end_margin: float = 0.1
    static_chunk: int = 2048
    max_running: int = 64
    replan_s: float = 10.0
    # Seeds random placement and the jitter factors.
    seed: int = 0
    precision: str = "bf16"
    # Disk read of a model's weights into host memory, GB/s, on its first
    # set-up and after it left host memory (None: every model is in pinned
    # host memory from the start), and the host memory that holds weights.
    disk_gbps: float | None = None
    host_memory_bytes: float = 432e9
    # Every iteration's modelled time times a seeded lognormal factor with
    # mean 1 and this coefficient of variation (planner.replay.noise).
    jitter_cv: float = 0.0

    def check(self) -> None:
        if not self.slices:
            raise ValueError("no MIG slice")
        for name in ("link_gbps", "pcie_gbps", "replan_s", "share_check_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {v}")
        if not (math.isfinite(self.switch_setup_s) and self.switch_setup_s >= 0):
            raise ValueError(f"switch_setup_s must be >= 0, got {self.switch_setup_s}")
        if self.load_link is not None and self.load_link not in LOAD_LINKS:
            raise ValueError(f"load_link must be one of {', '.join(LOAD_LINKS)}")
        if self.static_chunk <= 0 or self.max_running <= 0 or self.max_models_per_slice <= 0:
            raise ValueError("static_chunk, max_running and max_models_per_slice must be > 0")
        if not (math.isfinite(self.jitter_cv) and self.jitter_cv >= 0):
            raise ValueError(f"jitter_cv must be a finite number >= 0, got {self.jitter_cv}")
        if self.disk_gbps is not None and not (
            math.isfinite(self.disk_gbps) and self.disk_gbps > 0
        ):
            raise ValueError(f"disk_gbps must be a finite number > 0, got {self.disk_gbps}")
        if not (math.isfinite(self.host_memory_bytes) and self.host_memory_bytes > 0):
            raise ValueError(f"host_memory_bytes must be > 0, got {self.host_memory_bytes}")
        if self.share_max_in_flight < 0:
            raise ValueError(f"share_max_in_flight must be >= 0, got {self.share_max_in_flight}")
        if not 0 <= self.share_end_margin < 1:
            raise ValueError(f"share_end_margin must be in [0, 1), got {self.share_end_margin}")
        if self.kv_reserve_tokens < 0:
            raise ValueError(f"kv_reserve_tokens must be >= 0, got {self.kv_reserve_tokens}")
        if self.model.param_bytes <= 0:
            raise ValueError(f"model {self.model.name} has no parameter bytes")

    def load_link_of(self, policy: ServerlessPolicy) -> str:
        if policy.streams:
            return "c2c"
        return self.load_link if self.load_link is not None else policy.default_load_link

    def load_gbps_of(self, policy: ServerlessPolicy) -> float:
        return self.pcie_gbps if self.load_link_of(policy) == "pcie" else self.link_gbps


@dataclass(frozen=True, slots=True)
class SwitchRecord:
    time_s: float
    slice_id: str
    from_model: str
    to_model: str
    # From the switch decision until the slice can run the new model.
    latency_s: float
    # Weight bytes loaded into HBM (the HBM-resident baselines: all; the
    # policies that keep weights resident: the part kept) or 0.
    load_bytes: float
    # KV bytes of the evicted model's requests moved to host memory.
    kv_out_bytes: float = 0.0
    # The evicted model had requests in flight.
    preempted: bool = False


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
    # Models evicted with requests in flight.
    preemptions: int = 0
    # Evictions by why the slice could be taken (routing's eviction kinds).
    evictions: tuple[tuple[str, int], ...] = ()
    # Models set up on a slice another model was running on (taking turns).
    shares: int = 0
    # Models drained for a starving one, and the longest drain.
    drains: int = 0
    max_drain_s: float = 0.0
    # Running requests whose KV moved to host memory for lack of KV room.
    kv_swaps: int = 0
    # Requests whose KV cannot fit an empty slice.
    rejected: int = 0
    # TTFT of each request whose arrival found its model on no slice (the
    # paper's cold start, the weights in host memory).
    cold_ttft_s: tuple[float, ...] = ()
    # For each slice handed to a waiting model: how long that model had
    # waited (from its oldest request's arrival or preemption).
    placement_wait_s: tuple[float, ...] = ()
    # The starvation bound (policies that preempt; None otherwise) with the
    # most models that waited at once, the longest iteration and switch.
    starvation_bound_s: float | None = None
    max_waiting_models: int = 0
    max_iteration_s: float = 0.0
    max_switch_s: float = 0.0
    # Residents shed by busy shared slices; with a disk: weight reads into
    # host memory and models that left it.
    sheds: int = 0
    # Shares ended (policies that end them), by how (``end_share``'s actions).
    share_ends: tuple[tuple[str, int], ...] = ()
    disk_reads: int = 0
    host_evictions: int = 0

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


class ServerlessEngine:
    """records_timeline: sample the slices for the run's timeline
    (planner.replay.serverless_timeline; a report's plots)."""

    def __init__(
        self,
        config: ServerlessConfig,
        policy: str,
        trace: list[TraceRequest],
        *,
        records_timeline: bool = False,
    ) -> None:
        config.check()
        if policy not in SERVERLESS_POLICIES:
            raise ValueError(f"unknown serverless policy {policy!r}")
        self.config = config
        self.policy = policy
        self._p = SERVERLESS_POLICIES[policy]
        self.trace = trace
        self._rng = np.random.default_rng(config.seed)
        self._jitter = JitterFactors(config.jitter_cv, config.seed)
        # Every request at least one prompt and one output token, named by
        # its row where the trace names none.
        self._requests = [
            dataclasses.replace(
                t,
                id=t.id if t.id is not None else str(i),
                prompt_tokens=max(1, t.prompt_tokens),
                output_tokens=max(1, t.output_tokens),
            )
            for i, t in enumerate(trace)
        ]
        self._priorities = [
            float(t.priority) if t.priority is not None else 1.0 for t in self._requests
        ]
        # A resident with requests in flight has a priority between these.
        self._lowest_priority = min(self._priorities, default=1.0)
        self._highest_priority = max(self._priorities, default=1.0)
        self._columns = RequestColumns.from_trace(self._requests, config.slo)
        self._tokens = TokenTimes(self._columns.output_tokens)
        self._residency = [
            ModelResidency(
                self,
                max_running=config.max_running,
                kv_token_bytes=float(config.model.kv_bytes_per_token()),
                link_gbps=config.link_gbps,
            )
            for _ in config.slices
        ]
        self._slices = [
            Slice(
                i,
                f"mig{i}",
                p,
                kv_capacity_tokens(config.model, p, weights_in_hbm=not self._p.streams),
                BatchingCore(
                    _SLICE_CORE,
                    residency,
                    _NO_COMPUTE,
                    None,
                    self._columns,
                    tokens=self._tokens,
                    residency=residency,
                ),
                free_bytes=p.hbm_bytes * DEFAULT_MEMORY_UTILIZATION - RUNTIME_RESERVE_BYTES,
            )
            for i, (p, residency) in enumerate(zip(config.slices, self._residency, strict=True))
        ]
        for x, residency in zip(self._slices, self._residency, strict=True):
            residency.bind(x)
        self._per_slice = config.max_models_per_slice if self._p.shares else 1
        self._weight_bytes = float(config.model.param_bytes)
        self._model_pass = ModelPass(config.model)
        self._hbm_gbps = [p.hbm_bytes_per_s / GB for p in config.slices]
        self._kv_token_bytes = float(config.model.kv_bytes_per_token())
        self._tpot = config.slo.tbt_s
        self._streamed_bytes = self._weight_bytes - self._planned_resident_bytes()
        # Each model as the policy sees it (weight 1), by name.
        self._models: dict[str, ServerlessModel] = {}
        self._cache_chunk: dict[tuple[str, int], int] = {}
        self._cache_tiles: dict[tuple[str, bool], GemmTiles] = {}
        self._cache_rho: dict[tuple[str, bool], float] = {}
        self._cache_prefill: dict[str, float] = {}
        self._rhos: list[float] = []
        self._budget = (
            PlacementParams(link_gbps=config.link_gbps).link_budget_gbps
            if self._p.respects_link_budget
            else math.inf
        )
        self._load_link = SharedLink(config.load_gbps_of(self._p))
        self._load_version = 0
        self._loads: dict[int, Resident] = {}
        # Host memory as an LRU pool of models (with a disk), reads in flight.
        self._disk = SharedLink(config.disk_gbps) if config.disk_gbps is not None else None
        self._disk_version = 0
        self._in_host: dict[str, None] = {}
        self._reading: dict[int, str] = {}
        self._disk_waiters: dict[str, list[tuple[int, Resident, float]]] = {}
        self._disk_reads = 0
        self._host_evictions = 0
        # Copies of more resident weights in flight, by -1 - slice index.
        self._top_ups: dict[int, Resident] = {}
        self._init_s = (
            self._p.switch_profile.engine_init_s()
            if self._p.switch_profile is not None
            else config.switch_setup_s
            if self._p.streams
            else 0.0
        )
        self._loop: EventLoop[ServerlessWiring] = EventLoop()
        loads_c2c = config.load_link_of(self._p) == "c2c"
        self._timeline = (
            SliceTimeline(
                self._loop,
                self._slices,
                lambda: self._pending,
                lambda: self._c2c_bytes,
                lambda now: self._load_link.left_bytes(now) if loads_c2c else 0.0,
            )
            if records_timeline
            else None
        )
        self._reqs: list[SlicedRequest] = []
        self._queued = 0
        self._replan_at = 0.0
        self._window: list[str] = []
        self._progress: Callable[[float], None] | None = None
        self._pending: list[SlicedRequest] = []
        self._pending_deadline = math.inf
        self._pending_priority = -math.inf
        self._switches: list[SwitchRecord] = []
        self._c2c_bytes = 0.0
        self._load_bytes = 0.0
        self._iterations = 0
        self._replans = 0
        self._preemptions = 0
        self._drains = 0
        self._max_drain = 0.0
        self._shares = 0
        self._sheds = 0
        self._share_ends: dict[str, int] = {}
        # Models whose share just ended: no share for them until then.
        self._no_share: dict[str, float] = {}
        self._placement_waits: list[float] = []
        self._evictions: dict[str, int] = {}
        self._max_waiting = 0
        self._max_iteration = 0.0
        self._last = 0.0

    # -- what the policy sees ---------------------------------------------
    def _planned_resident_bytes(self) -> float:
        """What a model keeps resident in the least room placement may give
        it: on the smallest slice, next to as many models as may share it
        (what routing reckons its C2C demand from)."""
        if not self._p.keeps_resident or not all(self._holds(s) for s in self._slices):
            return 0.0
        k = self._per_slice
        free = min(s.free_bytes for s in self._slices)
        kv = self.config.kv_reserve_tokens * k * self._kv_token_bytes
        return float(resident_split([self._weight_bytes] * k, free, kv)[0])

    def _serverless_model(self, name: str, weight: float = 1.0) -> ServerlessModel:
        if weight == 1.0 and (known := self._models.get(name)) is not None:
            return known
        hbm = RUNTIME_RESERVE_BYTES + (0.0 if self._p.streams else self._weight_bytes)
        model = ServerlessModel(
            name, int(self._streamed_bytes), self._tpot, hbm_bytes=int(hbm), weight=weight
        )
        if weight == 1.0:
            self._models[name] = model
        return model

    def _demand(self, r: Resident) -> float:
        """The C2C bandwidth its decode needs: what it streams per TPOT."""
        if not self._p.streams:
            return 0.0
        return max(0.0, self._weight_bytes - r.resident_bytes) / self._tpot / GB

    def _priority(self, r: Resident) -> float:
        """The highest priority of ``r``'s requests (its own without any)."""
        if not r.in_flight:
            return r.priority
        if self._lowest_priority == self._highest_priority:
            return self._highest_priority
        return max(q.priority for q in r.requests)

    def _states(self, now: float) -> list[SliceState]:
        """One entry per resident model, one empty entry per idle slice. A
        resident leaving its slice is no place for its model: its requests
        in flight and its C2C demand count on the first resident staying."""
        out: list[SliceState] = []
        for s in self._slices:
            if not s.residents:
                out.append(SliceState(s.id, s.profile))
                continue
            extra_in_flight, extra_demand = 0, 0.0
            for r in s.residents:
                if r.leaving:
                    extra_in_flight += r.in_flight
                    extra_demand += self._demand(r)
            for r in s.residents:
                if r.successor is not None or r.leaving:
                    continue  # draining: its successor stands for the place
                on = r.requests
                out.append(
                    SliceState(
                        s.id,
                        s.profile,
                        model=r.model,
                        model_c2c_gbps=self._demand(r) + extra_demand,
                        model_priority=self._priority(r),
                        in_flight=len(on) + extra_in_flight,
                        last_used_s=r.last_used_s,
                        active_since_s=r.active_since_s,
                        # The least slack is the earliest deadline's.
                        slack_s=min(q.deadline_s for q in on) - now if on else math.inf,
                    )
                )
                extra_in_flight, extra_demand = 0, 0.0
        return out

    def _waiting(self, now: float) -> list[WaitingModel]:
        first: dict[str, SlicedRequest] = {}
        count: dict[str, int] = {}
        top: dict[str, float] = {}
        deadline: dict[str, float] = {}
        for r in self._pending:
            m = r.model
            d = r.deadline_s
            if m not in first:
                first[m], count[m], top[m], deadline[m] = r, 1, r.priority, d
                continue
            count[m] += 1
            top[m] = max(top[m], r.priority)
            deadline[m] = min(deadline[m], d)
        return [
            WaitingModel(
                self._serverless_model(m), top[m], r.waiting_since, count[m], deadline[m] - now
            )
            for m, r in first.items()
        ]

    def _pending_changed(self) -> None:
        self._pending_deadline = min((r.deadline_s for r in self._pending), default=math.inf)
        self._pending_priority = max((r.priority for r in self._pending), default=-math.inf)

    # -- per-policy choices ------------------------------------------------
    def _tiles(self, s: Slice, tokens: int) -> GemmTiles:
        key = (s.profile.name, tokens <= 64)
        tiles = self._cache_tiles.get(key)
        if tiles is None:
            k = choose_kernel(precision=self.config.precision, tokens=tokens, mig=s.profile)
            tiles = self._cache_tiles[key] = GemmTiles(k.sym_block_m, k.block_n, k.asym_block_k)
        return tiles

    def _chunk(self, s: Slice, prompt: int) -> int:
        if self._p.chunk == STATIC:
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

    def _runs_as_hbm(self, r: Resident) -> bool:
        """Whether ``r`` has every weight resident and the policy then runs
        it as the HBM baselines run theirs (static chunk, rho 0)."""
        return self._p.resident_like_hbm and self._weight_bytes - r.resident_bytes < 1024.0

    def _rho(self, s: Slice, r: Resident, tokens: int) -> float:
        if self._p.rho not in (BEST_STATIC, TUNER) or self._runs_as_hbm(r):
            return 0.0
        if self._p.rho == BEST_STATIC:
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
        if self._p.rho == TUNER:
            assert r.tuner is not None
            return r.tuner.state.rho
        return 0.0

    # -- scheduling ---------------------------------------------------------
    def _may_preempt(self, now: float) -> bool:
        """Whether a scheduling round at this boundary could preempt (a
        superset of eviction_order's conditions, checked cheaply)."""
        if not self._p.preempts or not self._pending:
            return False
        top = self._pending_priority
        residents = [r for s in self._slices for r in s.residents]
        if top > self._lowest_priority and any(
            r.in_flight and self._priority(r) < top for r in residents
        ):
            return True
        p = self.config.preemption
        urgent = self._pending_deadline - now <= p.urgent_slack_s
        if not urgent and now - self._pending[0].waiting_since < p.starve_after_s:
            return False
        return any(now - r.active_since_s >= p.min_hold_s for r in residents)

    def _schedule(self, now: float) -> None:
        if not self._pending:
            return
        waiting = self._waiting(now)
        self._max_waiting = max(self._max_waiting, len(waiting))
        states = self._states(now)
        routes: Sequence[ScheduledRoute]
        if self._p.placement == RANDOM_PLACEMENT:
            routes = self._random_round(waiting, states, now)
        else:
            routes = schedule_waiting(
                waiting,
                states,
                now_s=now,
                link_budget_gbps=self._budget,
                allow_preempt=self._p.preempts,
                preemption=self.config.preemption if self._p.preempts else None,
                max_models_per_slice=self._per_slice,
                share_max_in_flight=(
                    self.config.share_max_in_flight if self._p.shares_when_light else math.inf
                ),
                no_share=frozenset(m for m, t in self._no_share.items() if t >= now),
            )
        by_id = {s.id: s for s in self._slices}
        since = {w.model.name: w.waiting_since_s for w in waiting}
        for route in routes:
            d = route.decision
            if d.action == QUEUE:
                continue
            s = by_id[d.slice_id]
            leaver = any(r.leaving for r in s.residents)
            if d.action == SHARE and leaver and len(s.residents) >= self._per_slice:
                continue  # a resident leaving still holds the place
            if d.action != ACTIVE:
                self._placement_waits.append(now - since[route.model])
            if d.eviction:
                self._evictions[d.eviction] = self._evictions.get(d.eviction, 0) + 1
            if d.action == SHARE:
                self._shares += 1
            if d.action in (IDLE, EVICT, SHARE):
                self._set_up(s, route.model, now, replacing=d.evicted_model, drain=d.drains)
            self._place(s, route.model, now)

    def _random_round(
        self, waiting: list[WaitingModel], states: list[SliceState], now: float
    ) -> list[ScheduledRoute]:
        """Random placement: each waiting model (in service order) on a
        slice drawn among the idle ones that fit and the first kind of
        eviction candidates, ignoring the link budget."""
        out: list[ScheduledRoute] = []
        taken: set[str] = set()
        for w in service_order(waiting, now_s=now, preemption=self.config.preemption):
            active = [s for s in states if s.model == w.model.name]
            if active:
                best = min(active, key=lambda s: (s.in_flight, s.id))
                d = dataclasses.replace(_QUEUED, action=ACTIVE, slice_id=best.id)
                out.append(ScheduledRoute(w.model.name, d))
                continue
            free = [
                s
                for s in states
                if not s.model and s.id not in taken and fits(w.model, MigSlice(s.id, s.profile))
            ]
            kind = IDLE
            why = ""
            if not free:
                order = eviction_order(
                    w.model,
                    [s for s in states if s.id not in taken],
                    priority=w.priority,
                    link_budget_gbps=math.inf,
                    now_s=now,
                    waited_s=now - w.waiting_since_s,
                    waiter_slack_s=w.slack_s,
                    preemption=self.config.preemption,
                )
                if order:
                    why = order[0][1]
                    free = [s for s, k in order if k == why]
                    kind = EVICT
            if not free:
                out.append(ScheduledRoute(w.model.name, _QUEUED))
                continue
            pick = free[int(self._rng.integers(len(free)))]
            taken.add(pick.id)
            d = dataclasses.replace(
                _QUEUED, action=kind, slice_id=pick.id, evicted_model=pick.model, eviction=why
            )
            out.append(ScheduledRoute(w.model.name, d))
        return out

    def _place(self, s: Slice, model: str, now: float) -> None:
        """Every waiting request of ``model`` joins its resident on ``s``."""
        r = s.resident(model)
        assert r is not None
        kept: list[SlicedRequest] = []
        joining: list[int] = []
        for q in self._pending:
            if q.model == model:
                r.queue.append(q)
                joining.append(q.row)
            else:
                kept.append(q)
        s.core.state.join(joining)
        self._pending = kept
        self._pending_changed()
        self._kick(s, now)

    def _evict(self, s: Slice, r: Resident, now: float) -> tuple[float, float]:
        """Take resident ``r`` off ``s``: its requests leave when the
        iteration in progress ends, their KV moving to host memory, and wait
        again from then. Returns (when the slice is free of them, KV bytes
        moved)."""
        start = max(now, s.iter_end_s) if s.busy else now
        evicted = r.requests
        kv_out = sum(q.kv_tokens for q in evicted if not q.kv_in_host) * self._kv_token_bytes
        out_s = kv_out / (self.config.link_gbps * GB)
        s.core.state.leave([q.row for q in evicted], now, preempted=True)
        for q in evicted:
            if q.kv_tokens > 0:
                q.kv_in_host = True
            q.waiting_since = start
            q.ready_s = start + out_s
            bisect.insort(self._pending, q, key=wait_key)
        if evicted:
            self._preemptions += 1
            self._pending_changed()
        s.residents.remove(r)
        if self._top_ups.get(-1 - s.index) is r:
            del self._top_ups[-1 - s.index]
            self._load_link.cancel(-1 - s.index, now)
            r.copying_bytes = 0.0
            self._next_load_event()
        self._refresh_kv_capacity(s)
        if self._loads.get(s.index) is r:
            # Its weights were still loading: the others get the link.
            del self._loads[s.index]
            self._load_link.cancel(s.index, now)
            self._next_load_event()
        return start + out_s, kv_out

    def _set_up(
        self, s: Slice, model: str, now: float, *, replacing: str, drain: bool = False
    ) -> None:
        """Make ``model`` a resident of ``s`` (in place of ``replacing``, if
        given: preempted, or with ``drain`` drained first): engine set-up for
        streaming policies, weight load then engine work for the
        HBM-resident baselines."""
        free_at, kv_out = now, 0.0
        old = s.resident(replacing) if replacing else None
        if old is not None and drain:
            self._start_drain(s, old, model, now)
            return
        if old is not None:
            free_at, kv_out = self._evict(s, old, now)
        self._new_resident(s, model, now, free_at, replacing=replacing, kv_out=kv_out)

    def _start_drain(self, s: Slice, old: Resident, model: str, now: float) -> None:
        """``old`` takes no new requests: those not started go back to wait
        (keeping when they started waiting); ``model`` is set up on ``s``
        once the rest are done."""
        r = Resident(
            model,
            max((q.priority for q in self._pending if q.model == model), default=1.0),
            ready_s=math.inf,
            active_since_s=math.inf,
            last_used_s=now,
        )
        old.successor = r
        old.drain_since_s = now
        s.residents.append(r)
        self._unplace_fresh(s, old, now)
        self._drains += 1
        if old.in_flight == 0:
            self._finish_drain(s, old, now)
        else:
            self._loop.push(DrainLimit(now + self.config.preemption.max_drain_s, s.index))

    def _unplace_fresh(self, s: Slice, r: Resident, now: float) -> None:
        """``r``'s requests on ``s`` not started yet (no KV) wait again,
        keeping when they started waiting."""
        fresh = [q for q in r.queue if q.kv_tokens == 0 and not q.kv_in_host]
        s.core.state.leave([q.row for q in fresh], now, preempted=False)
        for q in fresh:
            r.queue.remove(q)
            bisect.insort(self._pending, q, key=wait_key)
        if fresh:
            self._pending_changed()

    def _drain_limit(self, s: Slice, now: float) -> None:
        """Preempt what a drain that reached its limit still has in flight."""
        limit = self.config.preemption.max_drain_s
        for old in [x for x in s.residents if x.successor is not None]:
            if now - old.drain_since_s < limit * (1 - 1e-9) or not old.in_flight:
                continue
            new = old.successor
            assert new is not None
            self._max_drain = max(self._max_drain, now - old.drain_since_s)
            free_at, kv_out = self._evict(s, old, now)
            s.residents.remove(new)
            self._new_resident(
                s, new.model, now, free_at, replacing=old.model, kv_out=kv_out, resident=new
            )
            self._kick(s, now)

    def _finish_drain(self, s: Slice, old: Resident, now: float) -> None:
        new = old.successor
        assert new is not None
        self._max_drain = max(self._max_drain, now - old.drain_since_s)
        s.residents.remove(old)
        s.residents.remove(new)
        self._new_resident(s, new.model, now, now, replacing=old.model, kv_out=0.0, resident=new)
        self._kick(s, now)

    def _new_resident(
        self,
        s: Slice,
        model: str,
        now: float,
        free_at: float,
        *,
        replacing: str,
        kv_out: float,
        resident: Resident | None = None,
    ) -> None:
        mine = [q for q in self._pending if q.model == model]
        r = resident or Resident(
            model,
            max((q.priority for q in mine), default=1.0),
            ready_s=math.inf,
            active_since_s=math.inf,
            last_used_s=now,
        )
        r.tuner = RhoTuner() if self._p.rho == TUNER else None
        r.resident_bytes = self._weight_bytes if not self._p.streams else 0.0
        if self._p.keeps_resident and self._holds(s):
            self._assign_residency(s, r)
        s.residents.append(r)
        self._refresh_kv_capacity(s)
        record = SwitchRecord(
            now,
            s.id,
            replacing,
            model,
            0.0,
            0.0,
            kv_out_bytes=kv_out,
            preempted=kv_out > 0,
        )
        reading = self._read_if_cold(model, now)
        if reading:
            r.disk_pending = True
            self._disk_waiters.setdefault(model, []).append((s.index, r, free_at))
        r.record = len(self._switches)
        if r.resident_bytes <= 0:
            if reading:
                self._switches.append(record)
                return
            r.ready_s = r.active_since_s = free_at + self.config.switch_setup_s
            self._switches.append(dataclasses.replace(record, latency_s=r.ready_s - now))
            return
        r.loading = r.record
        self._switches.append(dataclasses.replace(record, load_bytes=r.resident_bytes))
        if reading and not self._p.pipelined_load:
            return  # the copy starts once the read is done
        self._loop.push(LoadStarts(free_at, s.index))

    # -- the disk and host memory (with disk_gbps) --------------------------
    def _read_if_cold(self, model: str, now: float) -> bool:
        """Whether ``model``'s weights are still to come from disk (a read
        starts unless one is in flight); a model in host memory is used."""
        if self._disk is None:
            return False
        if model in self._in_host:
            self._in_host.pop(model)
            self._in_host[model] = None
            return False
        if model not in self._reading.values():
            key = self._disk_reads
            self._disk_reads += 1
            self._reading[key] = model
            self._disk.start(key, self._weight_bytes, now)
            self._next_disk_event()
        return True

    def _next_disk_event(self) -> None:
        assert self._disk is not None
        self._disk_version += 1
        t = self._disk.next_finish_s()
        if t is not None:
            self._loop.push(ReadsDone(t, self._disk_version))

    def _disk_done(self, now: float, version: int) -> None:
        """Reads done: the model joins host memory (the least recently used
        models on no slice leave it while it is over capacity), and each
        slice waiting for it carries on with its switch."""
        assert self._disk is not None
        if version != self._disk_version:
            return
        for key in self._disk.finished(now):
            model = self._reading.pop(key)
            self._in_host[model] = None
            on_slices = {r.model for x in self._slices for r in x.residents}
            for old in list(self._in_host):
                if len(self._in_host) * self._weight_bytes <= self.config.host_memory_bytes:
                    break
                if old != model and old not in on_slices:
                    del self._in_host[old]
                    self._host_evictions += 1
            for index, r, free_at in self._disk_waiters.pop(model, []):
                s = self._slices[index]
                if r not in s.residents:
                    continue
                r.disk_pending = False
                if r.resident_bytes <= 0:
                    self._ready(s, r, max(now, free_at) + self.config.switch_setup_s, now)
                elif self._p.pipelined_load:
                    if r.copied:
                        self._ready(s, r, now + self._init_s, now)
                else:
                    self._loop.push(LoadStarts(max(now, free_at), s.index))
        self._next_disk_event()

    def _ready(self, s: Slice, r: Resident, at: float, now: float) -> None:
        r.ready_s = r.active_since_s = at
        rec = self._switches[r.record]
        self._switches[r.record] = dataclasses.replace(rec, latency_s=at - rec.time_s)
        self._kick(s, now)

    def _assign_residency(self, s: Slice, r: Resident) -> None:
        """Split ``s``'s HBM among its residents and ``r`` joining them
        (``resident_split``): the KV kept is what is on the slice now, at
        least ``kv_reserve_tokens`` per model; residents only shrink (growing
        would need a copy), ``r`` gets the rest up to its weights."""
        others = list(s.residents)
        copying = sum(o.copying_bytes for o in others)
        split = resident_split(
            [o.resident_bytes for o in others] + [self._weight_bytes],
            s.free_bytes - copying,
            self._kv_keep(s, len(others) + 1),
        )
        for o, kept in zip(others, split, strict=False):
            o.resident_bytes = float(kept)
        r.resident_bytes = float(split[-1])

    def make_room(
        self,
        s: Slice,
        tokens: int,
        r: Resident,
        with_room: list[SlicedRequest],
        without: list[SlicedRequest],
        *,
        judged_tokens: int = 0,
    ) -> bool:
        """Drop resident weights of ``s`` (no copy: they stream instead)
        until its KV holds ``tokens``; whether it does. ``with_room`` and
        ``without``: the decodes ``r`` runs if the room is made and if not;
        under KV_TAKES_WEIGHTS_WHEN_FASTER the weights go only when the
        first makes the slice more decode tokens per second, with the
        weights left once the KV holds ``judged_tokens`` (at least
        ``tokens``: a prefill's whole prompt, not its next chunk)."""
        free = s.free_bytes - sum(o.copying_bytes for o in s.residents)
        if not self._p.keeps_resident or tokens * self._kv_token_bytes > free:
            return False
        before = [o.resident_bytes for o in s.residents]
        split = resident_split(before, free, tokens * self._kv_token_bytes)
        if self._p.kv_takes_weights == KV_TAKES_WEIGHTS_WHEN_ALONE and (
            without or any(o.running for o in s.residents if o is not r)
        ):
            return False
        if self._p.kv_takes_weights == KV_TAKES_WEIGHTS_WHEN_FASTER:
            judged = max(tokens, judged_tokens) * self._kv_token_bytes
            kept = [float(k) for k in resident_split(before, free, min(judged, free))]
            if kept != before and self._decode_rate(s, r, with_room, kept) <= (
                self._decode_rate(s, r, without, before)
            ):
                return False
        for o, k in zip(s.residents, split, strict=True):
            o.resident_bytes = float(k)
        self._refresh_kv_capacity(s)
        return s.kv_capacity >= tokens

    def _decode_rate(
        self, s: Slice, r: Resident, batch: list[SlicedRequest], resident: list[float]
    ) -> float:
        """Decode tokens per second of ``s``, its residents taking turns,
        with ``batch`` as ``r``'s decodes, the others' running ones, and
        ``resident`` bytes of weights kept per resident."""
        tokens, seconds = 0, 0.0
        for o, kept in zip(s.residents, resident, strict=True):
            decodes = batch if o is r else o.running
            if decodes:
                tokens += len(decodes)
                seconds += self._decode_s(s, o, decodes, kept)
        return tokens / seconds if seconds > 0 else 0.0

    def _decode_s(self, s: Slice, r: Resident, decodes: list[SlicedRequest], kept: float) -> float:
        """One decode step of ``decodes`` of ``r`` on ``s`` with ``kept``
        bytes of its weights resident (no jitter)."""
        context = sum(q.prompt_tokens + q.generated for q in decodes)
        all_kept = self._p.resident_like_hbm and self._weight_bytes - kept < 1024.0
        rho = 0.0 if all_kept or r.tuner is None else r.tuner.state.rho
        cost = self._model_pass.cost(
            len(decodes),
            rho=rho,
            mig=s.profile,
            c2c_gbps=self._share(s)[0],
            attended_pairs=float(context),
            kv_read_tokens=float(context),
            tiles=self._tiles(s, len(decodes)),
            resident_fraction=kept / self._weight_bytes,
            resident_reads_overlap=self._p.resident_like_hbm,
        )
        return cost.time_s

    def _kv_keep(self, s: Slice, models: int) -> float:
        """KV bytes ``s`` keeps when residency is decided: what it holds
        with the iteration in progress (a token per decode and its chunk), at
        least ``kv_reserve_tokens`` per model."""
        growing = sum(len(o.running) + (o.queue[0].chunk if o.queue else 0) for o in s.residents)
        tokens = max(s.kv_used + growing, self.config.kv_reserve_tokens * models)
        return tokens * self._kv_token_bytes

    def _top_up(self, s: Slice, r: Resident, now: float) -> None:
        """Copy more of ``r``'s weights into ``s``'s HBM (over C2C, while
        it runs) when at least ``MIN_TOP_UP_BYTES`` is free next to the KV
        kept: after a model sharing the slice left or the KV shrank."""
        key = -1 - s.index
        if not self._p.keeps_resident or r.loading is not None or key in self._top_ups:
            return
        if self._weight_bytes - r.resident_bytes < MIN_TOP_UP_BYTES or not self._holds(s):
            return
        room = s.free_bytes - s.resident_bytes - self._kv_keep(s, len(s.residents))
        take = min(room, self._weight_bytes - r.resident_bytes)
        if take < MIN_TOP_UP_BYTES:
            return
        r.copying_bytes = float(int(take))
        self._top_ups[key] = r
        self._refresh_kv_capacity(s)
        self._load_link.start(key, r.copying_bytes, now)
        self._load_bytes += r.copying_bytes
        self._c2c_bytes += r.copying_bytes
        self._next_load_event()

    def _holds(self, s: Slice) -> bool:
        """Whether ``s`` keeps weights resident: the policy keeps a part on
        any slice, or ``s`` holds all of a model's next to its KV reserve."""
        reserve = self.config.kv_reserve_tokens * self._kv_token_bytes
        return self._p.partial_residency or s.free_bytes - reserve >= self._weight_bytes

    def _refresh_kv_capacity(self, s: Slice) -> None:
        if self._p.keeps_resident:
            room = max(0.0, s.free_bytes - s.resident_bytes)
            s.kv_capacity = int(room // self._kv_token_bytes)

    def _load_start(self, s: Slice, now: float) -> None:
        if s.index in self._loads:
            return
        r = next(
            (
                x
                for x in s.residents
                if x.loading is not None and not (x.disk_pending and not self._p.pipelined_load)
            ),
            None,
        )
        if r is None:
            return  # evicted before its load began
        self._loads[s.index] = r
        self._load_link.start(s.index, r.resident_bytes, now)
        self._load_bytes += r.resident_bytes
        if self.config.load_link_of(self._p) == "c2c":
            self._c2c_bytes += r.resident_bytes
        self._next_load_event()

    def _next_load_event(self) -> None:
        self._load_version += 1
        t = self._load_link.next_finish_s()
        if t is not None:
            self._loop.push(LoadsDone(t, self._load_version))

    def _loads_done(self, now: float, version: int) -> None:
        if version != self._load_version:
            return
        freed: list[Slice] = []
        for index in self._load_link.finished(now):
            if index < 0:
                t = self._top_ups.pop(index)
                t.resident_bytes += t.copying_bytes
                t.copying_bytes = 0.0
                continue
            s = self._slices[index]
            r = self._loads.pop(index)
            r.loading = None
            freed.append(s)
            if r.disk_pending:
                r.copied = True  # ready once the read it overlaps is done
                continue
            self._ready(s, r, now + self._init_s, now)
        # A slice copies one model at a time: the next model set up on it
        # while this copy ran starts its own now.
        for s in freed:
            self._load_start(s, now)
        self._next_load_event()

    # -- simulation ---------------------------------------------------------
    def _kick(self, s: Slice, now: float) -> None:
        if s.busy:
            return
        starts = [r.ready_s for r in s.residents if r.in_flight and math.isfinite(r.ready_s)]
        if starts:
            s.busy = True
            s.iter_end_s = max(now, min(starts))
            self._loop.push(SliceIterates(s.iter_end_s, s.index))

    def _share(self, s: Slice) -> tuple[float, Sequence[Slice]]:
        if not self._p.streams:
            return self._hbm_gbps[s.index], ()
        others = [o for o in self._slices if o is not s and o.rate_gbps > 0]
        return self.config.link_gbps / (1 + len(others)), others

    def prefill_s_per_token(self, s: Slice) -> float:
        """A prefill's time per prompt token on ``s`` (chunks of the static
        size, the link shared by every slice): what a request's deadline
        is brought forward by for the prompt it has left."""
        key = (s.profile.name, -1)
        if key not in self._cache_chunk:
            tokens = self.config.static_chunk
            cost = self._model_pass.cost(
                tokens,
                rho=0.0,
                mig=s.profile,
                c2c_gbps=self.config.link_gbps / len(self._slices),
                tiles=self._tiles(s, tokens),
            )
            self._cache_prefill[s.profile.name] = cost.time_s / tokens
            self._cache_chunk[key] = tokens
        return self._cache_prefill[s.profile.name]

    # -- what model residency asks (model_residency.SliceTurns) ------------
    def link_share_gbps(self, s: Slice) -> float:
        return self._share(s)[0]

    def chunk_of(self, s: Slice, r: Resident, prompt_tokens: int) -> int:
        if self._runs_as_hbm(r):
            return self.config.static_chunk
        return self._chunk(s, prompt_tokens)

    def moved_in(self, kv_bytes: float) -> None:
        if self._p.streams:
            self._c2c_bytes += kv_bytes

    def pass_s(self, s: Slice, turn: Turn, work: Pass, now_s: float) -> float:
        cfg = self.config
        r = turn.resident
        chunk, context, start = work
        tokens = chunk + len(turn.decodes)
        pairs = float(context) + chunk * (start + chunk / 2.0)
        rho = self._rho(s, r, tokens)
        share, others = self._share(s)
        cost = self._model_pass.cost(
            tokens,
            rho=rho,
            mig=s.profile,
            c2c_gbps=share,
            attended_pairs=pairs,
            kv_read_tokens=float(context + start),
            tiles=self._tiles(s, tokens),
            resident_fraction=r.resident_bytes / self._weight_bytes if self._p.streams else 0.0,
            resident_reads_overlap=self._p.resident_like_hbm,
        )
        dt = self._jitter.apply(cost.time_s)
        if self._p.streams:
            s.rate_gbps = cost.c2c_bytes / dt / GB
            self._c2c_bytes += cost.c2c_bytes
            self._rhos.append(rho)
            if r.tuner is not None and not self._runs_as_hbm(r):
                u_c2c = min(1.0, (s.rate_gbps + sum(o.rate_gbps for o in others)) / cfg.link_gbps)
                u_hbm = min(1.0, cost.hbm_bytes / dt / s.profile.hbm_bytes_per_s)
                r.tuner.observe(
                    KnobObservation(
                        now_s=now_s + dt,
                        latency_s=dt,
                        latency_budget_s=cfg.slo.tbt_s,
                        hbm_util=u_hbm,
                        c2c_util=u_c2c,
                    )
                )
        self._iterations += 1
        self._max_iteration = max(self._max_iteration, dt)
        return dt

    def _iterate(self, s: Slice, now: float) -> None:
        s.busy = False
        if self._drains:  # a resident has a successor only once a drain started
            for done in [x for x in s.residents if x.successor is not None and not x.in_flight]:
                self._finish_drain(s, done, now)
                if s.busy:
                    return
        if self._p.shares_when_light and self._shed(s, now) and s.busy:
            return
        if self._p.ends_shares and len(s.residents) > 1 and self._end_share(s, now) and s.busy:
            return
        if self._p.preempts and self._may_preempt(now):
            self._schedule(now)
            if s.busy:
                return
        core = s.core
        core.now_s = now
        core._iteration()
        r = self._residency[s.index].turn.resident
        if r is NOBODY:
            s.rate_gbps = 0.0
            later = [
                max(x.ready_s, min((q.ready_s for q in x.requests), default=x.ready_s))
                for x in s.residents
                if x.in_flight
            ]
            later = [t for t in later if now < t < math.inf]
            if later:
                s.busy = True
                s.iter_end_s = min(later)
                self._loop.push(SliceIterates(s.iter_end_s, s.index))
            elif s.in_flight == 0:
                self._schedule(now)
            return
        end = core.now_s
        self._last = max(self._last, end)
        s.busy = True
        s.iter_end_s = end
        self._loop.push(SliceIterates(end, s.index))
        if self._p.keeps_resident:
            self._top_up(s, r, now)

    def _shed(self, s: Slice, now: float) -> bool:
        """A shared slice busier than ``share_max_in_flight`` sheds the
        resident with the fewest requests in flight (the latest to join on a
        tie): it takes no new requests (those not started wait again) and
        leaves once the rest are done, its HBM going to the others. Whether
        a resident left now."""
        staying = [r for r in s.residents if not r.leaving and r.successor is None]
        if len(staying) > 1 and s.in_flight > self.config.share_max_in_flight:
            i = min(range(len(staying)), key=lambda k: (staying[k].in_flight, -k))
            r = staying[i]
            r.leaving = True
            self._sheds += 1
            self._unplace_fresh(s, r, now)
        gone = [r for r in s.residents if r.leaving and not r.in_flight]
        for r in gone:
            self._evict(s, r, now)
        if gone:
            self._schedule(now)
        return bool(gone)

    def _end_share(self, s: Slice, now: float) -> bool:
        """Whether a resident left ``s`` by ``end_share``: one with nothing
        in flight next to a busy one, at once; of busy ones, weighed every
        ``share_check_s`` (the one that leaves with requests in flight has
        them preempted: they wait again, their KV in host memory, and it
        may not share again for the decision's wait bound)."""
        if any(
            r.successor is not None or r.leaving or r.loading is not None or r.ready_s > now
            for r in s.residents
        ):
            return False
        busy = sum(1 for r in s.residents if r.in_flight)
        if busy == len(s.residents):
            if now < s.share_check_at_s:
                return False
            s.share_check_at_s = now + self.config.share_check_s
            sharers = [self._sharer(s, r, now) for r in s.residents]
        elif busy:
            sharers = [
                Sharer(r.model, r.in_flight, 0, 0.0, 0.0, 0.0, 0.0, math.inf) for r in s.residents
            ]
        else:
            return False
        free = any(
            o is not s
            and fits(self._serverless_model("x"), MigSlice(o.id, o.profile))
            and all(
                not r.in_flight and r.successor is None and r.loading is None for r in o.residents
            )
            for o in self._slices
        )
        end = end_share(sharers, free_slice=free, margin=self.config.share_end_margin)
        if end is None:
            return False
        self._share_ends[end.action] = self._share_ends.get(end.action, 0) + 1
        leaver = next(r for r in s.residents if r.model == end.model)
        self._evict(s, leaver, now)
        if end.action != GIVE_UP:
            self._no_share[end.model] = now + end.wait_bound_s
            if end.wait_bound_s > 0:
                self._loop.push(ShareBoundEnds(now + end.wait_bound_s))
        self._schedule(now)
        return True

    def _sharer(self, s: Slice, r: Resident, now: float) -> Sharer:
        """``r`` on shared slice ``s`` as ``end_share`` weighs it: its
        decode step (its running batch, else its queue head as one decode)
        now and with what it keeps alone on ``s`` resident, the steps its
        requests in flight still need, what moving it costs, and how long
        its requests that can still meet their targets can wait
        (``_may_wait_s``)."""
        link = self.config.link_gbps * GB
        alone = r.resident_bytes
        if self._p.keeps_resident and self._holds(s):
            room = s.free_bytes - self._kv_keep(s, 1)
            alone = max(alone, min(self._weight_bytes, room))
        batch = r.running or list(r.queue)[:1]
        steps = max((q.output_tokens - q.generated for q in r.requests), default=0)
        for q in r.queue:
            if not q.prefill_done:
                chunk = q.chunk or self.config.static_chunk
                steps += math.ceil((q.prompt_tokens - q.prefilled) / chunk)
        kv = sum(q.kv_tokens for q in r.requests if not q.kv_in_host) * self._kv_token_bytes
        alone_step = self._decode_s(s, r, batch, alone)
        return Sharer(
            r.model,
            r.in_flight,
            steps,
            self._decode_s(s, r, batch, r.resident_bytes),
            alone_step,
            max(0.0, alone - r.resident_bytes - r.copying_bytes) / link,
            self._init_s + alone / link + 2 * kv / link,
            min(
                (w for q in r.requests if (w := self._may_wait_s(q, alone_step, now)) >= 0),
                default=math.inf,
            ),
        )

    def _may_wait_s(self, q: SlicedRequest, step_s: float, now: float) -> float:
        """How long ``q`` can wait from ``now`` and still meet its targets
        if it then runs a token every ``step_s``: before its first token,
        until its TTFT deadline; after it, its slack plus what its tokens
        left gain on the TPOT target (its TPOT is the mean over the
        request). Negative: it cannot meet them any more, before its first
        token (a TTFT missed), or with no token left to make up for it."""
        if not q.generated:
            return q.slack_s(now)
        left = q.output_tokens - q.generated
        return q.slack_s(now) + left * (q.slo_tbt_s - step_s)

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
        active = {r.model for s in self._slices for r in s.residents}
        demand = sum(self._demand(r) for s in self._slices for r in s.residents)
        full = self._serverless_model("x").c2c_gbps
        for a in plan.assignments:
            s = by_id[a.slice_id]
            if a.model in active or s.residents or s.busy:
                continue
            if demand + full <= self._budget * (1 + 1e-9):
                demand += full
                self._set_up(s, a.model, now, replacing="")
                active.add(a.model)

    def _starvation_bound(self, max_switch: float) -> float | None:
        backstop = math.isfinite(self.config.preemption.starve_after_s)
        if not self._p.preempts or self._max_waiting == 0 or not backstop:
            return None
        model = self._serverless_model("x")
        fitting = sum(1 for s in self._slices if fits(model, MigSlice(s.id, s.profile)))
        places = fitting * self._per_slice
        if math.isfinite(self._budget) and model.c2c_gbps > 0:
            places = min(places, int(self._budget * (1 + 1e-9) // model.c2c_gbps))
        if places <= 0:
            return None
        return starvation_bound_s(
            ahead=self._max_waiting - 1,
            usable_slices=places,
            preemption=self.config.preemption,
            iteration_s=self._max_iteration,
            switch_s=max_switch,
            drain_s=self._max_drain,
        )

    # -- the events' wiring (serverless_events.ServerlessWiring) -----------
    def arrive(self, row: int, now_s: float) -> None:
        r = self._reqs[row]
        self._last = max(self._last, now_s)
        self._window.append(r.model)
        if all(s.resident(r.model) is None for s in self._slices):
            self._queued += 1
            r.cold = True
        if self._p.prewarm and now_s >= self._replan_at:
            self._replan(now_s, self._window)
            self._window = []
            self._replan_at = now_s + self.config.replan_s
        bisect.insort(self._pending, r, key=wait_key)
        self._pending_changed()
        self._schedule(now_s)
        if self._progress is not None:
            self._progress(now_s)

    def iterate(self, slice_index: int, now_s: float) -> None:
        self._iterate(self._slices[slice_index], now_s)

    def start_load(self, slice_index: int, now_s: float) -> None:
        self._load_start(self._slices[slice_index], now_s)

    def finish_loads(self, version: int, now_s: float) -> None:
        self._loads_done(now_s, version)

    def end_drain(self, slice_index: int, now_s: float) -> None:
        self._drain_limit(self._slices[slice_index], now_s)

    def finish_reads(self, version: int, now_s: float) -> None:
        self._disk_done(now_s, version)

    def end_share_bound(self, now_s: float) -> None:
        self._no_share = {m: t for m, t in self._no_share.items() if t > now_s}
        self._schedule(now_s)

    def run(self, progress: Callable[[float], None] | None = None) -> ServerlessRun:
        cfg = self.config
        wall = time.perf_counter()
        if len(self._loop) or self._iterations:
            raise RuntimeError("a ServerlessEngine runs once")
        reqs = self._reqs
        columns = self._columns
        for i, t in enumerate(self._requests):
            reqs.append(
                SlicedRequest(
                    columns,
                    i,
                    t.model or DEFAULT_MODEL,
                    self._priorities[i],
                    t.prompt_tokens,
                    t.output_tokens,
                    t.arrival_s,
                    columns.slo_ttft_s.item(i),
                    columns.slo_tbt_s.item(i),
                    t.arrival_s,
                )
            )
            self._loop.push(RequestArrives(t.arrival_s, i))
        if self._timeline is not None and reqs:
            arrivals = [r.arrival_s for r in reqs]
            self._timeline.start(min(arrivals), max(arrivals))
        self._progress = progress
        loop = self._loop
        while loop:
            loop.pop().handle(self)
        queued = self._queued
        outcomes = request_outcomes(columns, self._requests, self._tokens, cfg.slo)
        first = min((r.arrival_s for r in outcomes), default=0.0)
        span = max(0.0, self._last - first)
        wall_s = time.perf_counter() - wall
        switch_s = tuple(w.latency_s for w in self._switches)
        max_switch = max(switch_s, default=0.0)
        result = ReplayResult(
            policy=self.policy,
            requests=outcomes,
            timeline=self._timeline.samples() if self._timeline is not None else [],
            totals=ReplayTotals(
                iterations=self._iterations,
                simulated_s=span,
                wall_s=wall_s,
                bytes_d2h=int(sum(w.kv_out_bytes for w in self._switches)),
                bytes_h2d=int(self._c2c_bytes + self._load_bytes),
                stall_s=0.0,
                preemptions=self._preemptions,
                swap_outs=sum(o.swap_outs for o in outcomes),
                swap_ins=sum(o.swap_ins for o in outcomes),
                peak_gpu_kv_blocks=0,
                gpu_kv_blocks_total=0,
            ),
        )
        stats = ServerlessStats(
            switches=len(self._switches),
            switch_latency_s=switch_s,
            c2c_bytes=self._c2c_bytes,
            load_bytes=self._load_bytes,
            link_gbps=cfg.link_gbps,
            span_s=span,
            iterations=self._iterations,
            replans=self._replans,
            queued=queued,
            mean_rho=float(np.mean(self._rhos)) if self._rhos else None,
            models=len({r.model for r in reqs}),
            preemptions=self._preemptions,
            evictions=tuple(sorted(self._evictions.items())),
            shares=self._shares,
            drains=self._drains,
            max_drain_s=self._max_drain,
            kv_swaps=sum(x.kv_swaps for x in self._residency),
            rejected=sum(x.rejected for x in self._residency),
            cold_ttft_s=tuple(
                o.token_times_s[0] - o.arrival_s
                for r, o in zip(reqs, outcomes, strict=True)
                if r.cold and o.token_times_s
            ),
            placement_wait_s=tuple(self._placement_waits),
            starvation_bound_s=self._starvation_bound(max_switch),
            max_waiting_models=self._max_waiting,
            max_iteration_s=self._max_iteration,
            max_switch_s=max_switch,
            sheds=self._sheds,
            share_ends=tuple(sorted(self._share_ends.items())),
            disk_reads=self._disk_reads,
            host_evictions=self._host_evictions,
        )
        return ServerlessRun(result, stats, self._switches)


_QUEUED = RouteDecision(QUEUE, "", "", 0.0, math.inf, "queue: no idle or evictable slice")
