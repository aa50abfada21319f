"""Inputs and outputs of the layer-offload policy (OrbitFlow, DESIGN.md §3.2).

Blocks here are one layer's KV blocks: a request with n tokens holds
ceil(n / block_size) of them in every layer."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from planner.solvers import SOLVER_BACKENDS, Backend, SolveStats

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class OffloadParams:
    """Planner knobs; the defaults are OrbitFlow's (alpha = 1)."""

    violation_cap: float = 1.0
    min_window_steps: int = 1
    max_window_steps: int = 64
    # planner.policies.offload.SearchMode: "pruned" (OrbitFlow's), "periodic"
    # (the non-pruned mode) or "exhaustive" (every pattern, few layers only).
    search_mode: str = "pruned"
    # Wall-clock limit of one solve, and of all the solves of one plan
    # (Pause-Resume re-solves share it).
    time_limit_s: float = 0.05
    # BRANCH_AND_BOUND (the planner's own search on the exact model,
    # planner.policies.offload.search), CPSAT or GUROBI (the surrogate ILP
    # through planner.solvers, its plan re-scored exactly) or EXHAUSTIVE
    # (every assignment on the exact model; small batches only).
    backend: Backend = Backend.BRANCH_AND_BOUND
    # Work limit of one plan's branch and bound solves, in nodes (None: the
    # clock only). Replay sets it so that a run gives the same plans on any
    # machine; then the time limit is only a backstop.
    node_limit: int | None = None
    # Work limit of one CPSAT or GUROBI solve (planner.solvers'
    # SolveOptions.work_limit: CP-SAT deterministic seconds, Gurobi work
    # units; None: the clock only). Replay sets it, as node_limit.
    ilp_work_limit: float | None = None
    # Stop once the objective is within this fraction of the best bound
    # (0: prove optimality or run to the time limit).
    relative_gap: float = 0.0
    # BRANCH_AND_BOUND: the requests its local search's stagger moves try per
    # round (planner.policies.offload.local_search; 0: no stagger moves;
    # None: the search's default, STAGGER_REQUESTS).
    stagger_requests: int | None = None
    # BRANCH_AND_BOUND: the spread moves on large trees (a second descent
    # from the spread start when the first local optimum leaves the link
    # idle, and spread kicks); False: the search before them.
    spread_moves: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.backend, Backend):
            object.__setattr__(self, "backend", backend_named(str(self.backend)))
        if self.node_limit is not None and self.node_limit < 1:
            raise ValueError(f"node_limit must be >= 1, got {self.node_limit}")
        if self.stagger_requests is not None and self.stagger_requests < 0:
            raise ValueError(f"stagger_requests must be >= 0, got {self.stagger_requests}")
        if self.ilp_work_limit is not None and not self.ilp_work_limit > 0.0:
            raise ValueError(f"ilp_work_limit must be > 0, got {self.ilp_work_limit}")


# Command-line names of the registered solver backends, the default first.
OFFLOAD_BACKEND_NAMES = tuple(
    "cp-sat" if name == Backend.CPSAT else name
    for name in sorted(SOLVER_BACKENDS, key=lambda n: n != Backend.BRANCH_AND_BOUND)
)


def backend_named(name: str) -> Backend:
    """The backend of a command-line name ("cp-sat" is CP-SAT's)."""
    try:
        return Backend("cpsat" if name == "cp-sat" else name)
    except ValueError:
        raise ValueError(
            f"unknown offload backend {name!r} (known: {', '.join(OFFLOAD_BACKEND_NAMES)})"
        ) from None


@dataclass(frozen=True, slots=True)
class DecodeBatch:
    """The requests to place, as columns. paused marks requests an earlier
    plan paused; steps_left < 0 means the remaining output is unknown."""

    ids: tuple[str, ...]
    num_tokens: IntArray
    deposited_tokens: IntArray
    slo_tbt_s: FloatArray
    paused: npt.NDArray[np.bool_]
    steps_left: IntArray

    def __post_init__(self) -> None:
        n = len(self.ids)
        for name in ("num_tokens", "deposited_tokens", "slo_tbt_s", "paused", "steps_left"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"DecodeBatch.{name} must have one entry per id")

    def __len__(self) -> int:
        return len(self.ids)

    def subset(self, rows: IntArray) -> DecodeBatch:
        return DecodeBatch(
            ids=tuple(self.ids[i] for i in rows.tolist()),
            num_tokens=self.num_tokens[rows],
            deposited_tokens=self.deposited_tokens[rows],
            slo_tbt_s=self.slo_tbt_s[rows],
            paused=self.paused[rows],
            steps_left=self.steps_left[rows],
        )


@dataclass(frozen=True, slots=True)
class OffloadInputs:
    """What one placement decision depends on besides the batch."""

    layer_compute_s: FloatArray
    link_blocks_per_s: float
    gpu_block_budget: int
    block_size_tokens: int = 16
    params: OffloadParams = field(default_factory=OffloadParams)

    @property
    def num_layers(self) -> int:
        return int(self.layer_compute_s.shape[0])


class PlanSource(enum.IntEnum):
    SOLVER = 1
    GREEDY_FALLBACK = 2
    EMPTY = 3


@dataclass(frozen=True, slots=True)
class Placement:
    """One request's placement for the window."""

    id: str
    # Offload distance k, 0 when nothing is offloaded or not a distance mask.
    distance: int
    offloaded_layers: tuple[int, ...]
    blocks_per_layer: int
    gpu_blocks: int
    fetched_blocks_per_step: int


@dataclass(frozen=True, slots=True)
class OffloadPlan:
    """A placement for the next window of decode steps, with the numbers
    behind it."""

    placements: tuple[Placement, ...]
    paused_ids: tuple[str, ...]
    newly_paused_ids: tuple[str, ...]
    resumed_ids: tuple[str, ...]
    prefetch_buffer_blocks: int
    gpu_blocks_used: int
    gpu_blocks_used_at_expiry: int
    gpu_block_budget: int
    predicted_step_s: float
    predicted_step_surrogate_s: float
    predicted_step_paper_s: float
    window_steps: int
    expiry_step: int
    violations_per_step: float
    source: PlanSource
    solve: SolveStats | None
    solves: int
    solve_wall_s: float
    summary: str
