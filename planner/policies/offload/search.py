"""The layer-offload search (the planner's default backend,
`Backend.BRANCH_AND_BOUND`; DESIGN.md §3.2): the plan of least exact
event-model step latency in the search space, with a proven bound on it.

- Objective: problem.py's exact latency (compiled event model,
  step_kernels.py), ties to the longer window, then fewer blocks fetched.
- Bound first: the root's bound (below); +inf proves the batch infeasible
  at once, and a plan that meets it is optimal.
- Starts: the warm start (previous plan), the greedy plan, a stall-aware
  greedy on the surrogate, every uniform pattern, and fill from nothing
  (local_search.py); when none is feasible, the tree below dives for a
  first plan (or proves there is none).
- Local search (local_search.improve, compiled): descent on the exact model
  with single, pair, compound and stagger moves (the requests whose fetch
  chains leave the link idle; stagger_requests=0 leaves them out) to a
  local optimum; on large trees, when that local optimum leaves the link
  idle for SPREAD_IDLE_SHARE of its step (too little fetched), a second
  descent from spread_start (many small requests offloading); then kicks
  (perturbation, spread kicks among them, and descent again) while the work
  lasts. spread_idle_share=None and spread_kicks=False give the search
  before the spread moves.
- Branch and bound (planner.solvers.branch_and_bound), depth-first over the
  requests, largest KV first, from the local optimum, on trees of at most
  EXACT_TREE_LIMIT assignments (the kicks get what it leaves). A node's
  bound is the relaxed latency of step_kernels.py (the best link schedule
  of the fetches placed so far) with the blocks the other requests must
  still fetch to fit the memory row (cover_bound.py, buffer_bound.py) added
  at the end: a lower bound on the exact latency of every completion.
  Leaves are evaluated exactly, except those that fail the first window's
  memory row (not simulated) or must end past the incumbent (stopped); each
  counts one node. On larger trees the bound stays the root's.
- Work: one node = one assignment simulated or one child bounded;
  `node_limit` stops on work (the same answer on any machine), the time
  limit on the clock. Stopped early, the result is FEASIBLE with the least
  bound over the nodes left (TIMEOUT_NO_SOLUTION without a plan).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from planner.policies.offload.buffer_bound import buffer_share
from planner.policies.offload.cover_bound import cover_curve
from planner.policies.offload.ilp import WindowOption
from planner.policies.offload.local_search import (
    STAGGER_REQUESTS,
    TALLY,
    evaluate_one,
    fill_from_nothing,
    idle_share,
    improve,
    new_work,
    now_s,
    packed,
)
from planner.policies.offload.local_search import stall_greedy as compiled_stall_greedy
from planner.policies.offload.node_bounds import child_bounds
from planner.policies.offload.problem import (
    LATENCY_RTOL,
    SLO_RTOL,
    OffloadProblem,
    better,
    offload_problem,
)
from planner.policies.offload.search_space import candidate_patterns
from planner.policies.offload.step_kernels import score_leaves
from planner.solvers import Children, Incumbent, Status
from planner.solvers import branch_and_bound as search_tree

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
T = TypeVar("T")

# Kicks of the local search after its first local optimum (it stops sooner
# when the work runs out).
KICKS = 1 << 30
# Trees of at most this many assignments are searched (branch and bound)
# after the first local optimum; larger ones get the kicks only.
EXACT_TREE_LIMIT = 1_000_000
# On large trees, a second descent from spread_start when the first local
# optimum leaves the link idle for at least this share of its step.
SPREAD_IDLE_SHARE = 0.05
# spread_start's pattern: the one offloading closest to this share of the layers.
SPREAD_LAYER_SHARE = 1 / 8


@dataclass(frozen=True, slots=True)
class SearchResult:
    status: Status
    choice: IntArray | None  # pattern per request
    objective: float | None  # exact step latency, s
    tiebreak: float | None
    best_bound: float | None  # lower bound on the exact step latency, s
    nodes: int
    node_limit: int | None
    wall_time_s: float
    time_limit_s: float
    moves: dict[str, int]  # what the local search did (local_search.TALLY)

    @property
    def has_solution(self) -> bool:
        return self.choice is not None

    @property
    def gap(self) -> float | None:
        if self.objective is None or self.best_bound is None:
            return None
        if self.objective <= self.best_bound * (1 + LATENCY_RTOL):
            return 0.0
        return (self.objective - self.best_bound) / max(abs(self.objective), 1e-12)


class _Work:
    """The search's clock and node budget."""

    def __init__(self, time_limit_s: float, node_limit: int | None) -> None:
        self.started = time.perf_counter()
        self.deadline = self.started + time_limit_s
        self.node_limit = node_limit
        self.nodes = 0

    def spent(self) -> bool:
        if self.node_limit is not None and self.nodes >= self.node_limit:
            return True
        return time.perf_counter() > self.deadline

    def left_s(self) -> float:
        return self.deadline - time.perf_counter()

    def run(self, kernel: Callable[..., T], p: tuple[Any, ...], *args: Any) -> T:
        """kernel(p, work, deadline, *args): a compiled step of the search
        (local_search.py); its simulations are added to the nodes."""
        budget = 1 << 62 if self.node_limit is None else max(self.node_limit - self.nodes, 0)
        counter = new_work(budget)
        out = kernel(p, counter, self.deadline, *args)
        self.nodes += int(counter[0])
        return out


class _Best:
    def __init__(self) -> None:
        self.choice: IntArray | None = None
        self.objective = math.inf
        self.tiebreak = math.inf

    def offer(self, choice: IntArray, objective: float, tiebreak: float) -> bool:
        if better(objective, tiebreak, self.objective, self.tiebreak):
            self.choice, self.objective, self.tiebreak = choice.copy(), objective, tiebreak
            return True
        return False

    def incumbent(self) -> Incumbent | None:
        if self.choice is None:
            return None
        return Incumbent(self.choice, self.objective, self.tiebreak)


def branch_and_bound(
    problem: OffloadProblem,
    *,
    time_limit_s: float,
    relative_gap: float = 0.0,
    starts: list[IntArray] | None = None,
    node_limit: int | None = None,
    stagger_requests: int = STAGGER_REQUESTS,
    spread_idle_share: float | None = SPREAD_IDLE_SHARE,
    spread_kicks: bool = True,
) -> SearchResult:
    """The best plan under the exact model, within the limits.
    stagger_requests: the requests the local search's stagger moves try per
    round (local_search.py; 0: none, the narrow, pair and compound moves
    only: the search before stagger moves). spread_idle_share: the link's
    idle share of the first local optimum's step from which a second
    descent starts from spread_start (None: never); spread_kicks: the
    kicks include spread kicks. None and False: the search before the
    spread moves (the bench's bnb-work-nospread; with stagger_requests=0
    too, its bnb-work-narrow)."""
    _load_kernels()
    work = _Work(time_limit_s, node_limit)
    best = _Best()
    p = problem
    nodes = _Nodes(p)
    root = nodes.root_bound()
    work.nodes += 1
    tally = np.zeros(len(TALLY), np.int64)
    if not math.isfinite(root):
        return _result(Status.INFEASIBLE, best, None, work, time_limit_s, tally)
    if p.num_requests == 0:
        ev = p.evaluate(np.zeros((1, 0), np.int64))
        best.offer(np.zeros(0, np.int64), float(ev.objective[0]), float(ev.tiebreak[0]))
        status = Status.OPTIMAL if best.choice is not None else Status.INFEASIBLE
        return _result(status, best, best.objective, work, time_limit_s, tally)
    kernel = packed(p)
    candidates = [np.asarray(s, dtype=np.int64) for s in (starts or [])]
    surrogate_start = stall_greedy(p)
    candidates.append(surrogate_start)
    candidates.extend(np.full(p.num_requests, c, dtype=np.int64) for c in range(p.num_choices))
    stacked = np.stack(candidates)
    ev = p.evaluate(stacked)
    work.nodes += len(stacked)
    i = ev.best()
    best.offer(stacked[i], float(ev.objective[i]), float(ev.tiebreak[i]))
    if not _within_gap(best.objective, root, relative_gap) and not work.spent():
        filled = work.run(fill_from_nothing, kernel)
        best.offer(filled, *evaluate_one(kernel, filled))
    if best.choice is None and not work.spent():
        # No start is feasible: the tree, stopped at its first plan, finds
        # one or proves there is none.
        found = search_tree(
            nodes,
            time_limit_s=max(work.left_s(), 1e-6),
            node_limit=node_limit,
            relative_gap=1.0,
            root_bound=root,
            nodes_used=work.nodes,
            rtol=LATENCY_RTOL,
        )
        work.nodes = found.nodes
        if found.incumbent is not None:
            best.offer(found.incumbent.choice, found.incumbent.objective, found.incumbent.tiebreak)
        elif found.complete:
            return _result(Status.INFEASIBLE, best, None, work, time_limit_s, tally)
    small = p.enumeration_size() <= EXACT_TREE_LIMIT
    proved = _within_gap(best.objective, root, relative_gap)
    if best.choice is not None and not proved and not work.spent():
        choice = best.choice.copy()
        # A small tree is searched after one local optimum, the kicks come
        # after; a large one gets the kicks only (after a second descent,
        # from the spread start, when the first leaves the link idle).
        descended = False
        if not small and spread_idle_share is not None:
            work.run(improve, kernel, choice, 0, tally, stagger_requests, False, spread_kicks)
            best.offer(choice, *evaluate_one(kernel, choice))
            descended = True
            if not work.spent() and work.run(idle_share, kernel, choice) >= spread_idle_share:
                spread = spread_start(p)
                if spread is not None:
                    work.run(
                        improve, kernel, spread, 0, tally, stagger_requests, False, spread_kicks
                    )
                    if best.offer(spread, *evaluate_one(kernel, spread)):
                        tally[TALLY.index("spread_improvements")] += 1
            choice = best.choice.copy()
        if not work.spent():
            kicks = 0 if small else KICKS
            work.run(
                improve, kernel, choice, kicks, tally, stagger_requests, descended, spread_kicks
            )
            best.offer(choice, *evaluate_one(kernel, choice))
    if _within_gap(best.objective, root, relative_gap):
        return _result(Status.OPTIMAL, best, root, work, time_limit_s, tally)
    if not small or work.spent():
        status = Status.FEASIBLE if best.choice is not None else Status.TIMEOUT_NO_SOLUTION
        return _result(status, best, root, work, time_limit_s, tally)
    out = search_tree(
        nodes,
        time_limit_s=max(work.left_s(), 1e-6),
        node_limit=node_limit,
        relative_gap=relative_gap,
        incumbent=best.incumbent(),
        root_bound=root,
        nodes_used=work.nodes,
        rtol=LATENCY_RTOL,
    )
    work.nodes = out.nodes
    if out.incumbent is not None:
        best.offer(out.incumbent.choice, out.incumbent.objective, out.incumbent.tiebreak)
    if not out.complete and best.choice is not None and not work.spent():
        choice = best.choice.copy()
        work.run(improve, kernel, choice, KICKS, tally, stagger_requests, False, spread_kicks)
        best.offer(choice, *evaluate_one(kernel, choice))
    bound = out.best_bound
    if bound is not None and math.isfinite(best.objective):
        bound = min(bound, best.objective)
    return _result(out.status, best, bound, work, time_limit_s, tally)


def spread_start(problem: OffloadProblem) -> IntArray | None:
    """A start that fetches from many small requests: the fewest of the
    smallest requests, smallest first, that meet the first window's memory
    row when each offloads the pattern closest to SPREAD_LAYER_SHARE of the
    layers (None: not even all of them do)."""
    p = problem
    if p.num_requests == 0 or p.num_choices < 2:
        return None
    share = np.abs(p.count[1:] - SPREAD_LAYER_SHARE * len(p.comp_s))
    pattern = 1 + int(np.argmin(share))
    order = np.argsort(p.blocks, kind="stable")
    none = p.mem_coef[0, order, 0]
    mem = none.sum() + np.cumsum(p.mem_coef[0, order, pattern] - none)  # the k + 1 smallest
    buffer = np.cumsum(p.fetch[order, pattern, :], axis=0).max(axis=1)
    fits = np.flatnonzero(mem + buffer <= p.mem_cap[0])
    if not len(fits):
        return None
    choice = np.zeros(p.num_requests, np.int64)
    choice[order[: fits[0] + 1]] = pattern
    return choice


def warm_up() -> None:
    """Load the compiled search (compile it, the first time on a machine)
    and its clock. The search does it before its first solve in a process,
    outside the solve's time limit; a caller with a deadline of its own (a
    server) can do it at start."""
    _load_kernels()


@functools.cache
def _load_kernels() -> None:
    blocks = np.array([40, 30, 20], dtype=np.int64)
    window = WindowOption(steps=1, ceiling_s=1.0, end_blocks=blocks)
    for budget in (200, 600):  # infeasible; then feasible only when offloading
        problem = offload_problem(
            np.full(8, 1e-3), 2e4, budget, blocks, candidate_patterns(8), windows=[window]
        )
        kernel = packed(problem)
        nodes = _Nodes(problem)
        nodes.expand(np.zeros(0, np.int64))
        nodes.expand(np.zeros(problem.num_requests - 1, np.int64))
        stall_greedy(problem)
        problem.evaluate(np.zeros((1, 3), np.int64))
        evaluate_one(kernel, np.zeros(3, np.int64))
        fill_from_nothing(kernel, new_work(64), math.inf)
        optimum = problem.enumerate().choice
        if optimum is not None:
            tally = np.zeros(len(TALLY), np.int64)
            improve(
                kernel, new_work(64), math.inf, optimum, 4, tally, STAGGER_REQUESTS, False, True
            )
            idle_share(kernel, new_work(64), math.inf, optimum)
            spread_start(problem)
    now_s()


def _within_gap(objective: float, bound: float, relative_gap: float) -> bool:
    return objective <= bound * (1 + LATENCY_RTOL) or (
        relative_gap > 0 and bound >= objective * (1 - relative_gap)
    )


def _result(  # noqa: PLR0917
    status: Status, best: _Best, bound: float | None, work: _Work, limit: float, tally: IntArray
) -> SearchResult:
    found = best.choice is not None
    if status is Status.TIMEOUT_NO_SOLUTION and found:
        status = Status.FEASIBLE
    if (
        status is Status.FEASIBLE
        and bound is not None
        and bound >= best.objective * (1 - LATENCY_RTOL)
    ):
        status = Status.OPTIMAL
    return SearchResult(
        status=status,
        choice=best.choice,
        objective=best.objective if found else None,
        tiebreak=best.tiebreak if found else None,
        best_bound=bound if bound is not None and math.isfinite(bound) else None,
        nodes=work.nodes,
        node_limit=work.node_limit,
        wall_time_s=time.perf_counter() - work.started,
        time_limit_s=limit,
        moves=dict(zip(TALLY, (int(v) for v in tally), strict=True)),
    )


class _Nodes:
    """The offload problem as the tree search sees it (AssignmentProblem)."""

    def __init__(self, problem: OffloadProblem) -> None:
        p = problem
        self.p = p
        self.order = np.argsort(-p.fetched.max(axis=1), kind="stable").astype(np.int64)
        self.blocks_f = p.blocks.astype(np.float64)
        self.offloadable = p.fetch.max(axis=(0, 1)) > 0  # (L,)
        # The buffer is at least t times the blocks fetched plus nu . F
        # (buffer_bound.py): uniform weights, and the LP's best.
        usable = max(int(self.offloadable.sum()), 1)
        uniform = np.where(self.offloadable, 1.0 / usable, 0.0)
        best_nu, best_share = buffer_share(p.fetch.max(axis=0) > 0)
        self.nus = np.ascontiguousarray([uniform, best_nu], dtype=np.float64)  # (2, L)
        self.shares = np.array([1.0 / usable, best_share])
        ordered_mem = p.mem_coef[:, self.order, :]  # (W, R, C)
        # Suffix sums over the requests still to place (index i: order[i:]).
        self.mem_min_suffix = np.ascontiguousarray(_suffix(ordered_mem.min(axis=2).T).T)  # (W, R+1)
        self.mem_max_free_suffix = _suffix((-ordered_mem[0]).max(axis=1))  # (R+1,)
        self.slo_min_suffix = np.ascontiguousarray(
            _suffix(p.slo_coef[:, self.order, :].min(axis=2).T).T
        )
        freed = (-p.mem_coef[0]).astype(np.float64)  # (R, C)
        self.fetch_curve = cover_curve(freed, p.fetched.astype(np.float64), self.order)
        self.choice_range = np.arange(p.num_choices, dtype=np.int64)

    @property
    def num_groups(self) -> int:
        return self.p.num_requests

    def assignment(self, partial: IntArray) -> IntArray:
        full = np.empty(self.p.num_requests, dtype=np.int64)
        full[self.order] = partial
        return full

    def root_bound(self) -> float:
        bound, _, _ = self._bounds(np.zeros((1, 0), dtype=np.int64))
        return float(bound[0])

    def expand(self, partial: IntArray, cutoff: float = math.inf) -> Children:
        p = self.p
        depth = len(partial)
        if depth + 1 == p.num_requests:
            full = np.empty((p.num_choices, p.num_requests), dtype=np.int64)
            full[:, self.order[:depth]] = partial
            full[:, self.order[depth]] = self.choice_range
            objective, tiebreak = score_leaves(
                p.comp_s,
                p.bandwidth_blocks_per_s,
                p.blocks_f,
                p.layers_of,
                p.count,
                p.mem_coef,
                p.mem_cap,
                p.slo_coef_f,
                p.slo_cap_s,
                SLO_RTOL,
                float(p.window_weight),
                full,
                cutoff,
            )
            return Children(objective, tiebreak, objective, leaves=True)
        choices = np.empty((p.num_choices, depth + 1), dtype=np.int64)
        choices[:, :depth] = partial
        choices[:, depth] = self.choice_range
        bound, tiebreak, dive = self._bounds(choices)
        return Children(bound, tiebreak, dive, leaves=False)

    def _bounds(self, choices: IntArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        p = self.p
        out: tuple[FloatArray, FloatArray, FloatArray] = child_bounds(
            p.comp_s,
            p.bandwidth_blocks_per_s,
            self.blocks_f,
            p.layers_of,
            p.count,
            self.order,
            p.fetch,
            p.fetched,
            p.mem_coef,
            p.mem_cap,
            p.slo_coef,
            p.slo_cap_s,
            SLO_RTOL,
            float(p.window_weight),
            self.mem_min_suffix,
            self.mem_max_free_suffix,
            self.slo_min_suffix,
            self.fetch_curve.freed,
            self.fetch_curve.cost,
            self.nus,
            self.shares,
            np.ascontiguousarray(choices),
        )
        return out


def _suffix(values: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Sums over values[i:] along the first axis, with a zero row appended."""
    flipped = np.cumsum(values[::-1], axis=0)[::-1]
    zero = np.zeros((1, *values.shape[1:]), dtype=flipped.dtype)
    out: npt.NDArray[np.int64] = np.concatenate((flipped, zero), axis=0)
    return out


def stall_greedy(problem: OffloadProblem) -> IntArray:
    """A start that minds the stall on the surrogate (local_search.py)."""
    p = problem
    choice: IntArray = compiled_stall_greedy(
        p.blocks,
        p.layers_of,
        p.count,
        p.fetched,
        p.hidden,
        p.mem_coef,
        p.mem_cap,
        p.slo_coef,
        p.slo_cap,
        p.stall_weight,
        p.window_weight,
    )
    return choice
