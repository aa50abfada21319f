"""The layer-offload ILP solved by its own branch and bound (the offload
planner's default backend; DESIGN.md §3.2).

A general MILP solver spends its time on what this problem's structure gives
for free: CP-SAT needs seconds to prove a 16 x 32 batch optimal and reports
a bound of 0 on the way (docs/offload.md has the numbers). Here:

- Every assignment is evaluated in closed form (problem.py).
- Start: the warm start (previous plan, else the greedy plan), improved by
  local search: the best single-request move, then the best pair move (one
  request offloads more so another can offload less), until none improves.
- Depth-first branch and bound over the requests, largest KV first; each
  node's children are bounded at once and searched best bound first.
- The bound at a node with remaining requests U: the stall already
  committed, plus the blocks U must still fetch to fit the memory row (at
  least the freed blocks they need times the smallest fetched-per-freed
  ratio among them) less the compute that can still hide fetches (on layers
  not yet stalling); the committed fetched blocks plus U's least; and the
  window options whose rows could still hold. Exact at a leaf.
- The search stops at its time limit (FEASIBLE, with the best bound over
  the unexplored nodes) or when every node is explored or pruned (OPTIMAL;
  with `relative_gap` > 0 a node is pruned once its bound is within that
  fraction of the incumbent, and the result says FEASIBLE with its bound
  unless the gap closed).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from planner.policies.offload.buffer_bound import buffer_share
from planner.policies.offload.cover_bound import cover_curve
from planner.policies.offload.problem import OffloadProblem
from planner.solvers import Status

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class SearchResult:
    status: Status
    choice: IntArray | None  # pattern per request
    objective: float | None
    best_bound: float | None
    nodes: int
    wall_time_s: float
    time_limit_s: float

    @property
    def has_solution(self) -> bool:
        return self.choice is not None

    @property
    def gap(self) -> float | None:
        if self.objective is None or self.best_bound is None:
            return None
        if self.objective <= self.best_bound:
            return 0.0
        return (self.objective - self.best_bound) / max(abs(self.objective), 1e-12)


def branch_and_bound(
    problem: OffloadProblem,
    *,
    time_limit_s: float,
    relative_gap: float = 0.0,
    starts: list[IntArray] | None = None,
    node_limit: int | None = None,
) -> SearchResult:
    """node_limit: also stop after this many node expansions (a budget that,
    unlike the clock, gives the same answer on any machine)."""
    started = time.perf_counter()
    deadline = started + time_limit_s
    search = _Search(problem, relative_gap)
    greedy_start = stall_greedy(problem, deadline)
    for start in [*(starts or []), greedy_start]:
        search.offer(np.asarray(start, dtype=np.int64))
    if search.best_choice is not None:
        search.offer(_local_search(problem, search.best_choice, deadline))
    complete = search.run(deadline, node_limit)
    wall = time.perf_counter() - started
    best = search.best if math.isfinite(search.best) else None
    bound: float | None
    if not complete:
        status = Status.TIMEOUT_NO_SOLUTION if best is None else Status.FEASIBLE
        bound = search.open_bound()
    elif best is None:
        status, bound = Status.INFEASIBLE, None
    else:
        bound = best if search.gap_bound is None else min(search.gap_bound, best)
        status = Status.FEASIBLE if bound < best else Status.OPTIMAL
    return SearchResult(
        status=status,
        choice=search.best_choice,
        objective=best,
        best_bound=None if bound is None or not math.isfinite(bound) else float(bound),
        nodes=search.nodes,
        wall_time_s=wall,
        time_limit_s=time_limit_s,
    )


class _Search:
    """Depth-first branch and bound state."""

    def __init__(self, problem: OffloadProblem, relative_gap: float) -> None:
        p = problem
        self.p = p
        self.relative_gap = relative_gap
        self.order = np.argsort(-p.fetched.max(axis=1), kind="stable").astype(np.int64)
        self.best = math.inf
        self.best_choice: IntArray | None = None
        self.gap_bound: float | None = None
        self.nodes = 0
        self.stack: list[tuple[float, int, IntArray, IntArray, IntArray, IntArray, int]] = []
        self.offloadable = p.fetch.max(axis=(0, 1)) > 0  # (L,)
        # The buffer is at least t times the blocks fetched plus nu . F
        # (buffer_bound.py): uniform weights, and the LP's best.
        usable = max(int(self.offloadable.sum()), 1)
        uniform = np.where(self.offloadable, 1.0 / usable, 0.0)
        self.buffer_shares = [(uniform, 1.0 / usable), buffer_share(p.fetch.max(axis=0) > 0)]
        num_r, w = p.num_requests, p.num_windows
        ordered_mem = p.mem_coef[:, self.order, :]  # (W, R, C)
        # Suffix sums over the remaining requests (index i: requests order[i:]).
        self.mem_min_suffix = _suffix(ordered_mem.min(axis=2).T).T  # (W, R+1)
        self.mem_max_free_suffix = _suffix((-ordered_mem[0]).max(axis=1))  # (R+1,)
        freed = -p.mem_coef[0]  # (R, C)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(freed > 0, p.fetched / np.where(freed > 0, freed, 1), np.inf)
        per_request = ratio.min(axis=1)[self.order]  # inf when a request cannot free
        self.ratio_suffix = _suffix_min(per_request)
        # Least cost of freeing memory (cover_bound.py), in blocks fetched and
        # in stall: a request offloading n layers fetches b blocks for each,
        # and a layer's spare compute hides at most H_max of them, whoever
        # else fetches there (max(0, sum b - s) >= sum max(0, b - s)), so it
        # adds at least n * max(0, b - H_max) block-times of stall.
        h_max = float(p.hidden[self.offloadable].max()) if self.offloadable.any() else 0.0
        blocks = p.fetch.max(axis=(1, 2)).astype(np.float64)  # (R,) b_r
        count = p.fetched / np.maximum(blocks, 1.0)[:, None]
        stall_cost = count * np.maximum(blocks - h_max, 0.0)[:, None]
        freed_f = freed.astype(np.float64)
        self.fetch_curve = cover_curve(freed_f, p.fetched.astype(np.float64), self.order)
        self.stall_curve = cover_curve(freed_f, stall_cost, self.order)
        self.slo_min_suffix = _suffix(p.slo_coef[:, self.order, :].min(axis=2).T).T
        self.num_r = num_r
        self.num_w = w

    def offer(self, choice: IntArray) -> None:
        value = float(self.p.evaluate(choice).objective[0])
        if value < self.best:
            self.best, self.best_choice = value, choice.copy()

    def prune_level(self) -> float:
        if not math.isfinite(self.best):
            return math.inf
        return self.best - self.relative_gap * abs(self.best)

    def run(self, deadline: float, node_limit: int | None = None) -> bool:
        p = self.p
        num_l = p.fetch.shape[2]
        zero_f = np.zeros(num_l, dtype=np.int64)
        zero_w = np.zeros(self.num_w, dtype=np.int64)
        root_lb, _ = self._bounds(0, zero_f[None, :], zero_w[None, :], zero_w[None, :], np.zeros(1))
        if not np.isfinite(root_lb[0]):
            return True
        self.stack.append((float(root_lb[0]), 0, np.zeros(0, np.int64), zero_f, zero_w, zero_w, 0))
        while self.stack:
            lb, depth, partial, f, mem, slo, fetched = self.stack.pop()
            if lb >= self.prune_level():
                self._gap_pruned(lb)
                continue
            if time.perf_counter() > deadline or (
                node_limit is not None and self.nodes >= node_limit
            ):
                self.stack.append((lb, depth, partial, f, mem, slo, fetched))
                return False
            self.nodes += 1
            r = int(self.order[depth])
            child_f = f[None, :] + p.fetch[r]  # (C, L)
            child_mem = mem[None, :] + p.mem_coef[:, r, :].T  # (C, W)
            child_slo = slo[None, :] + p.slo_coef[:, r, :].T
            child_fetched = fetched + p.fetched[r]
            bounds, order = self._bounds(depth + 1, child_f, child_mem, child_slo, child_fetched)
            level = self.prune_level()
            if depth + 1 == self.num_r:
                c = int(np.argmin(bounds))
                if bounds[c] < self.best:
                    full = np.empty(self.num_r, dtype=np.int64)
                    full[self.order] = np.append(partial, c)
                    self.best, self.best_choice = float(bounds[c]), full
                continue
            for c in np.argsort(-order, kind="stable").tolist():
                if bounds[c] >= level:
                    self._gap_pruned(float(bounds[c]))
                    continue
                self.stack.append(
                    (
                        float(bounds[c]),
                        depth + 1,
                        np.append(partial, c),
                        child_f[c],
                        child_mem[c],
                        child_slo[c],
                        int(child_fetched[c]),
                    )
                )
        return True

    def _gap_pruned(self, lb: float) -> None:
        if lb < self.best and math.isfinite(lb):
            self.gap_bound = lb if self.gap_bound is None else min(self.gap_bound, lb)

    def open_bound(self) -> float:
        bounds = [entry[0] for entry in self.stack]
        if self.gap_bound is not None:
            bounds.append(self.gap_bound)
        return min([*bounds, self.best]) if bounds or math.isfinite(self.best) else math.inf

    def _bounds(
        self,
        depth: int,
        f: IntArray,
        mem: IntArray,
        slo: IntArray,
        fetched: npt.ArrayLike,
    ) -> tuple[FloatArray, FloatArray]:
        """Lower bounds of the objective below nodes (rows): requests
        order[:depth] placed, giving per-layer fetches f (N, L), memory and
        SLO row sums (N, W) and fetched blocks (N,); and the key the search
        dives by: the same bound without the buffer's share, which leads to
        better plans sooner (measured: with the full bound as the key the
        plan found in 50 ms was 1-2 % worse)."""
        p = self.p
        hidden = p.hidden
        excess = f - hidden[None, :]
        committed = np.maximum(excess, 0).sum(axis=1)
        spare = np.where(self.offloadable[None, :], np.maximum(-excess, 0), 0).sum(axis=1)
        buffer = f.max(axis=1) if f.shape[1] else np.zeros(len(f), np.int64)
        mem_lb = mem.T + self.mem_min_suffix[:, depth][:, None] + buffer[None, :]  # (W, N)
        need = mem[:, 0] + buffer - p.mem_cap[0]  # blocks the rest must free
        ratio = self.ratio_suffix[depth]
        x = mem[:, 0] - p.mem_cap[0]
        if depth == self.num_r or not math.isfinite(ratio):
            must_fetch = basic = np.zeros(len(f))
            stall = committed + np.maximum(must_fetch - spare, 0)
        else:
            basic = np.ceil(np.maximum(need, 0) * ratio - 1e-6)
            # The blocks to free grow with the buffer, which is at least
            # nu . F + t * (blocks still to fetch) (buffer_bound.py): a few
            # rounds of fetch >= cost(x + nu . F + t * fetch) from below.
            to_free = np.maximum(need, 0).astype(np.float64)
            must_fetch = self.fetch_curve.at(depth, to_free)
            for _ in range(3):
                for nu, share in self.buffer_shares:
                    grown = x + f @ nu + share * np.where(np.isfinite(must_fetch), must_fetch, 0)
                    to_free = np.maximum(to_free, grown)
                must_fetch = np.maximum(must_fetch, self.fetch_curve.at(depth, to_free))
            unreachable = ~np.isfinite(must_fetch)
            must_fetch = np.where(unreachable, 0.0, np.ceil(must_fetch - 1e-6))
            least_stall = self.stall_curve.at(depth, to_free)
            least_stall = np.where(unreachable, 0.0, np.ceil(least_stall - 1e-6))
            stall = committed + np.maximum(np.maximum(must_fetch - spare, 0), least_stall)
            need = np.where(unreachable, np.inf, need)
        slo_lb = slo.T + self.slo_min_suffix[:, depth][:, None] + stall[None, :]
        holds = (mem_lb <= p.mem_cap[:, None]) & (slo_lb <= p.slo_cap[:, None])
        held = np.cumprod(holds, axis=0).sum(axis=0)
        feasible = (held > 0) & (need <= self.mem_max_free_suffix[depth])
        rest = p.window_weight * (self.num_w - held).astype(np.float64) + np.asarray(
            fetched, dtype=np.float64
        )
        bound = p.stall_weight * stall.astype(np.float64) + rest + must_fetch
        dive = p.stall_weight * (committed + np.maximum(basic - spare, 0)) + rest + basic
        return np.where(feasible, bound, np.inf), np.where(feasible, dive, np.inf)


def _suffix_min(values: FloatArray) -> FloatArray:
    """Minima over values[i:], with +inf appended."""
    out: FloatArray = np.minimum.accumulate(np.append(values, np.inf)[::-1])[::-1]
    return out


def _suffix(values: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Sums over values[i:] along the first axis, with a zero row appended."""
    flipped = np.cumsum(values[::-1], axis=0)[::-1]
    zero = np.zeros((1, *values.shape[1:]), dtype=flipped.dtype)
    out: npt.NDArray[np.int64] = np.concatenate((flipped, zero), axis=0)
    return out


@dataclass(frozen=True, slots=True)
class _Moves:
    """Assignments one move away from a base one, evaluated incrementally
    (M moves): the same quantities as OffloadProblem.evaluate."""

    choice: IntArray  # (M, R)
    objective: FloatArray  # (M,) +inf when infeasible
    mem_excess: IntArray  # (M,) window 0's memory row minus its cap
    stall: IntArray  # (M,) total stall


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
    """A start that minds the stall: from nothing offloaded, while window 0's
    memory row does not hold, take the single move (to any pattern) that adds
    the least stall per block it frees (fewer fetched blocks breaking ties);
    the first feasible single move ends it at once."""
    p = problem
    choice = np.zeros(p.num_requests, dtype=np.int64)
    if math.isfinite(float(p.evaluate(choice).objective[0])):
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


def _local_search(
    problem: OffloadProblem, choice: IntArray, deadline: float, *, max_rounds: int = 64
) -> IntArray:
    """Best-improvement single and pair moves from a feasible assignment."""
    p = problem
    current = choice.copy()
    value = float(p.evaluate(current).objective[0])
    if not math.isfinite(value):
        return current
    singles = _single_changes(p)
    for _ in range(max_rounds):
        if time.perf_counter() > deadline:
            break
        m = _moves(p, current, singles)
        i = int(np.argmin(m.objective))
        if m.objective[i] < value:
            current, value = m.choice[i], float(m.objective[i])
            continue
        # Pair moves: r one pattern up, s one pattern down (r != s).
        pairs = _pair_changes(current, p.num_choices)
        if not len(pairs):
            break
        m = _moves(p, current, pairs)
        i = int(np.argmin(m.objective))
        if not m.objective[i] < value:
            break
        current, value = m.choice[i], float(m.objective[i])
    return current
