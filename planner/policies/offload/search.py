"""The layer-offload search (the planner's default backend,
`Backend.BRANCH_AND_BOUND`; DESIGN.md §3.2): the plan of least exact
event-model step latency in the search space, with a proven bound on it.

- Objective: problem.py's exact latency (compiled event model,
  step_kernels.py), ties to the longer window, then fewer blocks fetched.
- Starts: the warm start (previous plan), the greedy plan, a stall-aware
  greedy on the surrogate, and every uniform pattern; the best feasible one
  is improved by local search under the exact model: single-request moves,
  then pairs (one request offloads one pattern more, another one less), each
  round's moves ordered by the surrogate and evaluated exactly in chunks,
  the best of the first chunk that improves taken.
- Then depth-first branch and bound (planner.solvers.branch_and_bound) over
  the requests, largest KV first. A node's bound is the relaxed latency of
  step_kernels.py (the best link schedule of the fetches placed so far) with
  the blocks the other requests must still fetch to fit the memory row
  (cover_bound.py, buffer_bound.py) added at the end: a lower bound on the
  exact latency of every completion. Leaves are evaluated exactly.
- Work: one node = one assignment or child evaluated (exactly or bounded);
  `node_limit` stops on work (the same answer on any machine), the time limit
  on the clock. Stopped early, the result is FEASIBLE with the least bound
  over the nodes left (TIMEOUT_NO_SOLUTION without a plan).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from planner.policies.offload.buffer_bound import buffer_share
from planner.policies.offload.cover_bound import cover_curve
from planner.policies.offload.problem import LATENCY_RTOL, SLO_RTOL, OffloadProblem, better
from planner.policies.offload.step_kernels import relaxed_latencies
from planner.solvers import Children, Incumbent, Status
from planner.solvers import branch_and_bound as search_tree

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

# Local search: moves evaluated exactly per chunk, per request of the batch.
CHUNK_PER_REQUEST = 2
MIN_CHUNK = 16
MAX_ROUNDS = 64


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


def branch_and_bound(
    problem: OffloadProblem,
    *,
    time_limit_s: float,
    relative_gap: float = 0.0,
    starts: list[IntArray] | None = None,
    node_limit: int | None = None,
) -> SearchResult:
    """The best plan under the exact model, within the limits."""
    work = _Work(time_limit_s, node_limit)
    best = _Best()
    p = problem
    candidates = [np.asarray(s, dtype=np.int64) for s in (starts or [])]
    candidates.append(stall_greedy(p, work.deadline))
    candidates.extend(np.full(p.num_requests, c, dtype=np.int64) for c in range(p.num_choices))
    stacked = np.stack(candidates) if p.num_requests else np.zeros((1, 0), np.int64)
    ev = p.evaluate(stacked)
    work.nodes += len(stacked)
    i = ev.best()
    best.offer(stacked[i], float(ev.objective[i]), float(ev.tiebreak[i]))
    if best.choice is not None:
        _local_search(p, best, work)
    nodes = _Nodes(p)
    root = nodes.root_bound()
    incumbent = (
        None if best.choice is None else Incumbent(best.choice, best.objective, best.tiebreak)
    )
    if p.num_requests == 0:
        outcome_status = Status.OPTIMAL if incumbent is not None else Status.INFEASIBLE
        return _result(outcome_status, best, best.objective, work, time_limit_s)
    out = search_tree(
        nodes,
        time_limit_s=max(work.left_s(), 1e-6),
        node_limit=node_limit,
        relative_gap=relative_gap,
        incumbent=incumbent,
        root_bound=root,
        nodes_used=work.nodes,
        rtol=LATENCY_RTOL,
    )
    work.nodes = out.nodes
    if out.incumbent is not None:
        best.offer(out.incumbent.choice, out.incumbent.objective, out.incumbent.tiebreak)
    bound = out.best_bound
    if bound is not None and math.isfinite(best.objective):
        bound = min(bound, best.objective)
    return _result(out.status, best, bound, work, time_limit_s)


def _result(
    status: Status, best: _Best, bound: float | None, work: _Work, limit: float
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
        self.buffer_shares = [(uniform, 1.0 / usable), buffer_share(p.fetch.max(axis=0) > 0)]
        ordered_mem = p.mem_coef[:, self.order, :]  # (W, R, C)
        # Suffix sums over the requests still to place (index i: order[i:]).
        self.mem_min_suffix = _suffix(ordered_mem.min(axis=2).T).T  # (W, R+1)
        self.mem_max_free_suffix = _suffix((-ordered_mem[0]).max(axis=1))  # (R+1,)
        freed = (-p.mem_coef[0]).astype(np.float64)  # (R, C)
        self.fetch_curve = cover_curve(freed, p.fetched.astype(np.float64), self.order)
        self.slo_min_suffix = _suffix(p.slo_coef[:, self.order, :].min(axis=2).T).T

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

    def expand(self, partial: IntArray) -> Children:
        p = self.p
        depth = len(partial)
        choices = np.empty((p.num_choices, depth + 1), dtype=np.int64)
        choices[:, :depth] = partial
        choices[:, depth] = np.arange(p.num_choices)
        if depth + 1 == p.num_requests:
            full = np.empty((p.num_choices, p.num_requests), dtype=np.int64)
            full[:, self.order] = choices
            ev = p.evaluate(full)
            return Children(ev.objective, ev.tiebreak, ev.objective, leaves=True)
        bound, tiebreak, dive = self._bounds(choices)
        return Children(bound, tiebreak, dive, leaves=False)

    def _bounds(self, choices: IntArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Lower bounds (latency, tiebreak) below nodes whose first requests
        (order[:depth]) take choices (N, depth), and the dive key."""
        p = self.p
        n, depth = choices.shape
        placed = self.order[:depth]
        f = (
            p.fetch[placed[None, :], choices].sum(axis=1)
            if depth
            else np.zeros((n, p.fetch.shape[2]), np.int64)
        )  # (N, L)
        mem = p.mem_coef[:, placed[None, :], choices].sum(axis=2).T  # (N, W)
        slo = p.slo_coef[:, placed[None, :], choices].sum(axis=2).T
        fetched = p.fetched[placed[None, :], choices].sum(axis=1).astype(np.float64)
        buffer = f.max(axis=1) if f.shape[1] else np.zeros(n, np.int64)
        mem_lb = mem.T + self.mem_min_suffix[:, depth][:, None] + buffer[None, :]  # (W, N)
        need = (mem[:, 0] + buffer - p.mem_cap[0]).astype(np.float64)  # blocks the rest must free
        x = (mem[:, 0] - p.mem_cap[0]).astype(np.float64)
        if depth == p.num_requests:
            must_fetch = np.zeros(n)
        else:
            # The blocks to free grow with the buffer, which is at least
            # nu . F + t * (blocks still to fetch) (buffer_bound.py): a few
            # rounds of fetch >= cost(x + nu . F + t * fetch) from below.
            to_free = np.maximum(need, 0.0)
            must_fetch = self.fetch_curve.at(depth, to_free)
            for _ in range(3):
                for nu, share in self.buffer_shares:
                    grown = x + f @ nu + share * np.where(np.isfinite(must_fetch), must_fetch, 0)
                    to_free = np.maximum(to_free, grown)
                must_fetch = np.maximum(must_fetch, self.fetch_curve.at(depth, to_free))
            unreachable = ~np.isfinite(must_fetch)
            must_fetch = np.where(unreachable, 0.0, np.ceil(must_fetch - 1e-6))
            need = np.where(unreachable, np.inf, need)
        latency = relaxed_latencies(
            p.comp_s,
            p.bandwidth_blocks_per_s,
            self.blocks_f,
            p.layers_of,
            p.count,
            self.order,
            np.ascontiguousarray(choices),
            must_fetch,
        )
        slo_lb = (
            latency[None, :]
            + (slo.T + self.slo_min_suffix[:, depth][:, None]) / p.bandwidth_blocks_per_s
        )
        holds = (mem_lb <= p.mem_cap[:, None]) & (slo_lb <= p.slo_cap_s[:, None] * (1 + SLO_RTOL))
        held = np.cumprod(holds, axis=0).sum(axis=0)
        feasible = (held > 0) & (need <= self.mem_max_free_suffix[depth])
        tiebreak = p.window_weight * (p.num_windows - held).astype(np.float64) + fetched
        tiebreak = tiebreak + must_fetch
        bound = np.where(feasible, latency, np.inf)
        # Dive: least bound first, fewer fetched blocks breaking ties.
        dive = np.where(
            feasible, latency * (1 + 1e-9 * tiebreak / max(tiebreak.max(), 1.0)), np.inf
        )
        return bound, tiebreak, dive


def _suffix(values: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Sums over values[i:] along the first axis, with a zero row appended."""
    flipped = np.cumsum(values[::-1], axis=0)[::-1]
    zero = np.zeros((1, *values.shape[1:]), dtype=flipped.dtype)
    out: npt.NDArray[np.int64] = np.concatenate((flipped, zero), axis=0)
    return out


@dataclass(frozen=True, slots=True)
class _Moves:
    """Assignments one move away from a base one, scored by the surrogate
    (M moves) without the exact model."""

    choice: IntArray  # (M, R)
    objective: FloatArray  # (M,) the surrogate objective, +inf when infeasible
    mem_excess: IntArray  # (M,) window 0's memory row minus its cap
    stall: IntArray  # (M,) total surrogate stall


def _moves(p: OffloadProblem, base: IntArray, changes: IntArray) -> _Moves:
    """changes: (M, K, 2) rows of (request, new pattern); K requests move."""
    per_layer = p.fetch[np.arange(p.num_requests), base].sum(axis=0)  # (L,)
    r, c = changes[..., 0], changes[..., 1]
    old = base[r]
    f = per_layer[None, :] + (p.fetch[r, c] - p.fetch[r, old]).sum(axis=1)  # (M, L)
    stall = np.maximum(f - p.hidden[None, :], 0).sum(axis=1)
    buffer = f.max(axis=1) if f.shape[1] else np.zeros(len(f), np.int64)
    rows = np.arange(p.num_requests)
    base_mem = p.mem_coef[:, rows, base].sum(axis=1)  # (W,)
    base_slo = p.slo_coef[:, rows, base].sum(axis=1)
    mem = base_mem[:, None] + (p.mem_coef[:, r, c] - p.mem_coef[:, r, old]).sum(axis=2) + buffer
    slo = base_slo[:, None] + (p.slo_coef[:, r, c] - p.slo_coef[:, r, old]).sum(axis=2) + stall
    fetched = p.fetched[rows, base].sum() + (p.fetched[r, c] - p.fetched[r, old]).sum(axis=1)
    holds = (mem <= p.mem_cap[:, None]) & (slo <= p.slo_cap[:, None])
    held = np.cumprod(holds, axis=0).sum(axis=0)
    objective = (
        p.stall_weight * stall.astype(np.float64)
        + p.window_weight * (p.num_windows - held).astype(np.float64)
        + fetched
    )
    objective[held == 0] = np.inf
    choice = np.repeat(base[None, :], len(changes), axis=0)
    choice[np.arange(len(changes))[:, None], r] = c
    return _Moves(choice, objective, mem[0] - p.mem_cap[0], stall)


def _single_changes(p: OffloadProblem) -> IntArray:
    r, c = np.meshgrid(np.arange(p.num_requests), np.arange(p.num_choices), indexing="ij")
    return np.stack((r.ravel(), c.ravel()), axis=1)[:, None, :].astype(np.int64)


def stall_greedy(problem: OffloadProblem, deadline: float = math.inf) -> IntArray:
    """A start that minds the stall (on the surrogate): from nothing
    offloaded, while window 0's memory row does not hold, take the single
    move (to any pattern) that adds the least stall per block it frees (fewer
    fetched blocks breaking ties); the first feasible single move ends it."""
    p = problem
    choice = np.zeros(p.num_requests, dtype=np.int64)
    if math.isfinite(float(p.evaluate_surrogate(choice).objective[0])):
        return choice
    changes = _single_changes(p)
    fetched = p.fetched[changes[:, 0, 0], changes[:, 0, 1]].astype(np.float64)
    for _ in range(p.num_requests * p.num_choices):
        m = _moves(p, choice, changes)
        stay = np.array([[[0, choice[0]]]], dtype=np.int64)  # choice itself
        if np.isfinite(m.objective).any():
            found: IntArray = m.choice[int(np.argmin(m.objective))]
            return found
        here = _moves(p, choice, stay)
        if here.mem_excess[0] <= 0 or time.perf_counter() > deadline:
            break
        freed = here.mem_excess[0] - m.mem_excess
        added = (m.stall - here.stall[0]).astype(np.float64)
        own = fetched - p.fetched[changes[:, 0, 0], choice[changes[:, 0, 0]]]
        score = np.where(freed > 0, (added + 1e-6 * own) / np.maximum(freed, 1), np.inf)
        if not np.isfinite(score).any():
            break
        choice = m.choice[int(np.argmin(score))]
    return choice


def _pair_changes(current: IntArray, num_choices: int) -> IntArray:
    """Moves of two requests at once: r one pattern up, s one pattern down."""
    up = np.flatnonzero(current < num_choices - 1)
    down = np.flatnonzero(current > 0)
    r, s = np.meshgrid(up, down, indexing="ij")
    keep = (r != s).ravel()
    r, s = r.ravel()[keep], s.ravel()[keep]
    changes: IntArray = np.stack(
        (np.stack((r, current[r] + 1), axis=1), np.stack((s, current[s] - 1), axis=1)), axis=1
    ).astype(np.int64)
    return changes


def _improve(p: OffloadProblem, best: _Best, changes: IntArray, work: _Work) -> bool:
    """Evaluate the moves from best.choice exactly, those the surrogate
    rates best first, in chunks; take the best of the first chunk that
    improves. Moves that break window 0's memory row are not evaluated."""
    assert best.choice is not None
    if not len(changes):
        return False
    m = _moves(p, best.choice, changes)
    fits = np.flatnonzero(m.mem_excess <= 0)
    if not fits.size:
        return False
    ranked = fits[np.argsort(m.objective[fits], kind="stable")]
    chunk = max(MIN_CHUNK, CHUNK_PER_REQUEST * p.num_requests)
    for start in range(0, ranked.size, chunk):
        if work.spent():
            return False
        rows = m.choice[ranked[start : start + chunk]]
        ev = p.evaluate(rows)
        work.nodes += len(rows)
        i = ev.best()
        if best.offer(rows[i], float(ev.objective[i]), float(ev.tiebreak[i])):
            return True
    return False


def _local_search(p: OffloadProblem, best: _Best, work: _Work) -> None:
    """Single moves, then pair moves, under the exact model, until neither
    improves or the work runs out."""
    singles = _single_changes(p)
    for _ in range(MAX_ROUNDS):
        if work.spent():
            return
        assert best.choice is not None
        if _improve(p, best, singles, work):
            continue
        if not _improve(p, best, _pair_changes(best.choice, p.num_choices), work):
            return
