"""Serverless over a CPU-GPU link (C2CServe, DESIGN.md §3.5): models whose
weights live in CPU memory, MIG slices that stream them over the shared C2C
link, and the plans the serverless policy makes for them."""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.profiles.mig import GB, MigSliceProfile


@dataclass(frozen=True, slots=True)
class ServerlessModel:
    """A CPU-resident model as the placement sees it."""

    name: str
    # W_m: weight bytes streamed over C2C once per decode step.
    weight_bytes: int
    # TPOT_m: the decode target per output token.
    tpot_s: float
    # HBM the model needs on its slice while resident (KV cache, activations).
    hbm_bytes: int = 0
    # HBM bandwidth its decode needs on its slice (KV reads, activations).
    hbm_gbps: float = 0.0
    # Fewest SMs that meet its targets (0: any slice).
    min_sms: int = 0
    # Value of serving it now (priority x expected load); > 0.
    weight: float = 1.0
    # Must be placed (a plan without it is infeasible).
    required: bool = False

    @property
    def c2c_gbps(self) -> float:
        """W_m / TPOT_m: the C2C bandwidth its decode needs."""
        return self.weight_bytes / self.tpot_s / GB


@dataclass(frozen=True, slots=True)
class MigSlice:
    """One MIG instance of the GPU."""

    id: str
    profile: MigSliceProfile


@dataclass(frozen=True, slots=True)
class PlacementParams:
    # Usable C2C bandwidth (GB/s) and the fraction placement may fill.
    link_gbps: float
    utilization_cap: float = 0.9
    # Models resident on one slice at once (they take turns; 1: one active
    # model per MIG instance, the paper's setting).
    max_models_per_slice: int = 1
    # lambda of the objective, relative to the smallest model weight.
    contention_weight: float = 1e-3
    # "auto": greedy, then the solver unless the greedy is proven optimal;
    # "greedy"; "solver" (always); the solver backend: "cpsat", "gurobi",
    # "exhaustive", "auto".
    method: str = "auto"
    backend: str = "cpsat"
    time_limit_s: float = 0.2

    @property
    def link_budget_gbps(self) -> float:
        return self.link_gbps * self.utilization_cap


@dataclass(frozen=True, slots=True)
class SolveStats:
    backend: str
    status: str
    objective: float | None
    best_bound: float | None
    gap: float | None
    wall_s: float
    time_limit_s: float
    note: str = ""


@dataclass(frozen=True, slots=True)
class ModelAssignment:
    model: str
    slice_id: str
    c2c_gbps: float


@dataclass(frozen=True, slots=True)
class PlacementPlan:
    """Which models are active on which slices, with the numbers behind it."""

    assignments: tuple[ModelAssignment, ...]
    # Models left in CPU memory only, each with why.
    unplaced: tuple[tuple[str, str], ...]
    # Sum over slices of the largest demand among its models.
    link_demand_gbps: float
    link_budget_gbps: float
    # Largest hbm_gbps / slice bandwidth among the assignments.
    max_slice_hbm_utilization: float
    served_weight: float
    # sum(weight) - lambda * (link demand / budget + max slice HBM utilization)
    objective: float
    greedy_objective: float
    # "greedy-proven", "greedy", "solver", "greedy-fallback", "infeasible"
    source: str
    feasible: bool
    solve: SolveStats | None
    summary: str


@dataclass(frozen=True, slots=True)
class SliceState:
    """A slice as routing sees it now."""

    id: str
    profile: MigSliceProfile
    # The active model ("" when the slice is idle: no model set up).
    model: str = ""
    # That model's C2C demand (GB/s).
    model_c2c_gbps: float = 0.0
    # Its priority and the requests it is serving now.
    model_priority: float = 0.0
    in_flight: int = 0
    # When it last served a request (the caller's clock).
    last_used_s: float = 0.0
    # When its model became ready to run there (after the switch).
    active_since_s: float = 0.0
    # The least slack among its requests: for a request still waiting for
    # its first token, TTFT deadline - now; for one decoding, the time it
    # may pause now and keep its mean TPOT within the target ((tokens - 1)
    # x TPOT target - time since its first token). inf: nothing with a
    # deadline.
    slack_s: float = math.inf


@dataclass(frozen=True, slots=True)
class PreemptionParams:
    """When a waiting model may take a slice from an active model of equal
    priority (queue-aware routing). Only a model that has been ready on its
    slice for at least ``min_hold_s`` (Q) can be preempted:

    - by a waiting model whose most urgent request has at most
      ``urgent_slack_s`` (U) of slack left, if every request on that slice
      has at least ``victim_slack_s`` (V) of slack (it can wait until it is
      urgent itself and then get a slice back, and still keep its targets);
    - by a waiting model whose oldest request has waited ``starve_after_s``
      (W_s), whatever the slack, by draining: the victim takes no new
      requests and hands its place over once its requests in flight are
      done, or after ``max_drain_s`` (D), preempting what is left. The
      backstop that, with starving models served oldest first,
      bounds every model's wait (``starvation_bound_s``).

    Slack: for a request without its first token, TTFT deadline - now; for
    one decoding, the pause it can take now and keep its mean TPOT within
    the target ((tokens - 1) x TPOT target - time since its first token).
    """

    min_hold_s: float
    urgent_slack_s: float
    victim_slack_s: float
    starve_after_s: float
    # A drain lasts at most this long; what is still in flight then is
    # preempted (requeued, KV to host).
    max_drain_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("min_hold_s", "max_drain_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        # inf: never (no slack is enough; no model starves).
        for name in ("victim_slack_s", "starve_after_s"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"{name} must be a number >= 0 (inf: never), got {value}")
        if not math.isfinite(self.urgent_slack_s):
            raise ValueError(f"urgent_slack_s must be a finite number, got {self.urgent_slack_s}")


@dataclass(frozen=True, slots=True)
class WaitingModel:
    """A model with requests waiting for a slice."""

    model: ServerlessModel
    priority: float
    # When its oldest waiting request started waiting (its arrival, or when
    # it was preempted off a slice).
    waiting_since_s: float
    requests: int = 1
    # The least slack among its waiting requests (see PreemptionParams).
    slack_s: float = math.inf


@dataclass(frozen=True, slots=True)
class RouteDecision:
    # "active", "idle", "evict" or "queue".
    action: str
    slice_id: str
    evicted_model: str
    # The active set's C2C demand after the decision, and the budget.
    link_demand_gbps: float
    link_budget_gbps: float
    reason: str
    # The evicted model has requests in flight, which the engine requeues
    # (their KV moves to host memory).
    preempts: bool = False
    # Why that slice could be taken: "inactive", "lower-priority", "held"
    # (the waiting model is urgent, the victim has slack) or "starving".
    eviction: str = ""
    # The evicted model is drained, not preempted: it takes no new
    # requests, its requests in flight finish, then the model switches
    # (a starving model's place; request-granularity switching).
    drains: bool = False


@dataclass(frozen=True, slots=True)
class ScheduledRoute:
    """One waiting model's decision within a scheduling round."""

    model: str
    decision: RouteDecision


@dataclass(frozen=True, slots=True)
class ChunkChoice:
    chunk_tokens: int
    # Whether the chosen row meets the TTFT target within the slice's HBM
    # bandwidth and compute (False: the fastest row, as a fallback).
    meets_target: bool
    ttft_s: float
    hbm_gbps_needed: float
    compute_tflops_needed: float
    burst_c2c_gbps: float
    reason: str


@dataclass(frozen=True, slots=True)
class KernelChoice:
    family: str
    precision: str
    shape: str
    sym_block_m: int
    block_n: int
    asym_block_k: int
    # The tuner's start (0: the C2C-frugal weight-stationary path, §3.5).
    initial_rho: float
    # The cost model's static optimum for this pass (information).
    model_best_rho: float
    reason: str
