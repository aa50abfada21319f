"""Depth-first branch and bound over problems of one choice per group
(`Backend.BRANCH_AND_BOUND`).

The problem supplies the groups' search order, the bounds of a node's
children and, at the last group, their exact objective (or, for a leaf
that cannot beat the incumbent, any value above the incumbent's); this
module owns
the search: the incumbent, the stack (children searched by their dive key,
smallest first), pruning, the limits and what the search proved.

Objectives are lexicographic pairs (primary, tiebreak): the primary is what
the search minimises and what bound and gap are stated in; the tiebreak
(integers, smaller wins) orders plans of equal primary. Primaries within a
relative `rtol` of each other are equal.

Limits: a wall-clock limit and a work limit in nodes (each child bounded or
evaluated counts one); the work limit gives the same answer on any machine,
the clock does not. When a limit stops the search, the best bound is the
least bound over the nodes not yet explored (FEASIBLE with a plan,
TIMEOUT_NO_SOLUTION without); a search that ends proves the incumbent
optimal (OPTIMAL) or that there is none (INFEASIBLE). With `relative_gap` a
node is pruned once its bound is within that fraction of the incumbent; the
status is then FEASIBLE unless the bound still met the incumbent.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from .result import Status

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Children:
    """The children of a node (one per choice of the next group): bounds on
    the objective below each (the exact objective when `leaves`), and the
    dive key that orders the search."""

    bound: FloatArray  # (K,) +inf: no feasible completion
    tiebreak: FloatArray  # (K,) lower bound on the tiebreak (exact at leaves)
    dive: FloatArray  # (K,)
    leaves: bool


class AssignmentProblem(Protocol):
    @property
    def num_groups(self) -> int:
        """Groups to assign, in search order."""
        ...

    def expand(self, partial: IntArray, cutoff: float) -> Children:
        """The children of the node whose first len(partial) groups (in
        search order) take these choices. cutoff: the incumbent's objective
        (+inf without one); a leaf whose objective is above it may report
        any value above it (+inf included) instead."""
        ...

    def assignment(self, partial: IntArray) -> IntArray:
        """A complete node's choices in the problem's own group order."""
        ...


@dataclass(frozen=True, slots=True)
class Incumbent:
    choice: IntArray
    objective: float
    tiebreak: float


@dataclass(frozen=True, slots=True)
class SearchOutcome:
    status: Status
    incumbent: Incumbent | None
    best_bound: float | None
    nodes: int
    wall_s: float
    complete: bool


def _before(a: float, ta: float, b: float, tb: float, rtol: float) -> bool:
    """(a, ta) strictly before (b, tb)."""
    if not math.isfinite(a):
        return False
    if not math.isfinite(b):
        return True
    if a < b * (1 - rtol):
        return True
    if a > b * (1 + rtol):
        return False
    return ta < tb


def branch_and_bound(
    problem: AssignmentProblem,
    *,
    time_limit_s: float,
    node_limit: int | None = None,
    relative_gap: float = 0.0,
    incumbent: Incumbent | None = None,
    root_bound: float = 0.0,
    nodes_used: int = 0,
    rtol: float = 1e-12,
) -> SearchOutcome:
    """Search from the root. `incumbent`: the best plan known before (its
    objective must be exact); `root_bound`: a bound on the whole problem;
    `nodes_used`: work already spent against node_limit (a heuristic's)."""
    if not (time_limit_s > 0 and math.isfinite(time_limit_s)):
        raise ValueError(f"time_limit_s must be a positive finite number, got {time_limit_s}")
    if node_limit is not None and node_limit < 0:
        raise ValueError(f"node_limit must be >= 0, got {node_limit}")
    started = time.perf_counter()
    deadline = started + time_limit_s
    best = incumbent
    nodes = nodes_used
    gap_pruned = math.inf  # least bound of a node pruned by the gap only
    # (bound, tiebreak bound, partial choices)
    stack: list[tuple[float, float, IntArray]] = [
        (root_bound, -math.inf, np.zeros(0, dtype=np.int64))
    ]

    def prunes(bound: float, tiebreak: float) -> bool:
        """No node below this bound can beat the incumbent (by more than the
        gap)."""
        if best is None:
            return not math.isfinite(bound)
        if relative_gap > 0 and bound >= best.objective * (1 - relative_gap):
            nonlocal gap_pruned
            if bound < best.objective * (1 - rtol):
                gap_pruned = min(gap_pruned, bound)
            return True
        return not _before(bound, tiebreak, best.objective, best.tiebreak, rtol)

    complete = True
    while stack:
        bound, tiebreak, partial = stack.pop()
        if prunes(bound, tiebreak):
            continue
        if time.perf_counter() > deadline or (node_limit is not None and nodes >= node_limit):
            stack.append((bound, tiebreak, partial))
            complete = False
            break
        children = problem.expand(partial, math.inf if best is None else best.objective)
        nodes += len(children.bound)
        if children.leaves:
            if len(children.bound):
                low = float(children.bound.min())
                tied = children.bound <= low * (1 + rtol)
                c = int(np.argmin(np.where(tied, children.tiebreak, np.inf)))
                value, tie = float(children.bound[c]), float(children.tiebreak[c])
                if math.isfinite(value) and (
                    best is None or _before(value, tie, best.objective, best.tiebreak, rtol)
                ):
                    best = Incumbent(
                        problem.assignment(np.append(partial, c).astype(np.int64)), value, tie
                    )
            continue
        base = np.empty(len(partial) + 1, dtype=np.int64)
        base[:-1] = partial
        bounds, tiebreaks = children.bound.tolist(), children.tiebreak.tolist()
        for c in np.argsort(-children.dive, kind="stable").tolist():
            b, t = bounds[c], tiebreaks[c]
            if prunes(b, t):
                continue
            child = base.copy()
            child[-1] = c
            stack.append((b, t, child))
    wall = time.perf_counter() - started
    open_bounds = [entry[0] for entry in stack]
    if math.isfinite(gap_pruned):
        open_bounds.append(gap_pruned)
    if not complete:
        status = Status.TIMEOUT_NO_SOLUTION if best is None else Status.FEASIBLE
        bound_value = min(open_bounds) if open_bounds else None
        if best is not None:
            bound_value = (
                best.objective if bound_value is None else min(bound_value, best.objective)
            )
    elif best is None:
        status, bound_value = Status.INFEASIBLE, None
    else:
        bound_value = min([*open_bounds, best.objective])
        status = Status.FEASIBLE if bound_value < best.objective * (1 - rtol) else Status.OPTIMAL
    if bound_value is not None and not math.isfinite(bound_value):
        bound_value = None
    return SearchOutcome(status, best, bound_value, nodes, wall, complete)
