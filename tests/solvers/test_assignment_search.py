"""planner.solvers.branch_and_bound on a small problem with its own bounds:
the optimum of brute force, infeasibility proved, the node limit's
deterministic stop with a bound, and the relative gap."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from planner.solvers import Children, Incumbent, Status, branch_and_bound


class Knapsack:
    """Choose one option per group; cost[g, c] to minimise, weight[g, c] whose
    sum must reach `need`; ties broken by the total weight (smaller wins)."""

    def __init__(self, cost: np.ndarray, weight: np.ndarray, need: int) -> None:
        self.cost, self.weight, self.need = cost, weight, need
        self.max_rest = np.append(np.cumsum(weight.max(axis=1)[::-1])[::-1], 0)

    @property
    def num_groups(self) -> int:
        return len(self.cost)

    def expand(self, partial: np.ndarray, cutoff: float) -> Children:
        d = len(partial)
        rows = np.arange(d)
        cost = self.cost[rows, partial].sum() + self.cost[d]
        weight = self.weight[rows, partial].sum() + self.weight[d]
        reachable = weight + self.max_rest[d + 1] >= self.need
        bound = np.where(reachable, cost + self.cost[d + 1 :].min(axis=1).sum(), np.inf)
        return Children(
            bound.astype(float), weight.astype(float), bound.astype(float), d + 1 == len(self.cost)
        )

    def assignment(self, partial: np.ndarray) -> np.ndarray:
        return partial

    def brute(self) -> tuple[float, float]:
        best = (math.inf, math.inf)
        for choice in itertools.product(range(self.cost.shape[1]), repeat=len(self.cost)):
            rows = np.arange(len(self.cost))
            w = self.weight[rows, choice].sum()
            if w >= self.need:
                best = min(best, (float(self.cost[rows, choice].sum()), float(w)))
        return best


def _problem(seed: int, need_fraction: float) -> Knapsack:
    rng = np.random.default_rng(seed)
    cost = rng.integers(0, 20, (6, 4)).astype(float)
    weight = rng.integers(0, 10, (6, 4))
    need = int(weight.max(axis=1).sum() * need_fraction)
    return Knapsack(cost, weight, need)


@pytest.mark.parametrize("seed", range(8))
def test_equals_brute_force(seed: int) -> None:
    problem = _problem(seed, 0.7)
    out = branch_and_bound(problem, time_limit_s=30.0)
    best, weight = problem.brute()
    assert out.status is Status.OPTIMAL and out.complete
    assert out.incumbent is not None
    assert (out.incumbent.objective, out.incumbent.tiebreak) == (best, weight)
    assert out.best_bound == best


def test_infeasible_is_proved() -> None:
    problem = _problem(0, 1.5)
    out = branch_and_bound(problem, time_limit_s=30.0)
    assert out.status is Status.INFEASIBLE and out.incumbent is None and out.best_bound is None


def test_node_limit_stops_the_same_way_every_time() -> None:
    problem = _problem(3, 0.7)
    first = branch_and_bound(problem, time_limit_s=30.0, node_limit=20)
    again = branch_and_bound(problem, time_limit_s=30.0, node_limit=20)
    assert not first.complete and first.nodes == again.nodes
    assert first.status in {Status.FEASIBLE, Status.TIMEOUT_NO_SOLUTION}
    assert first.best_bound == again.best_bound
    best, _ = problem.brute()
    assert first.best_bound is not None and first.best_bound <= best


def test_a_given_incumbent_and_the_gap() -> None:
    problem = _problem(5, 0.7)
    best, _ = problem.brute()
    start = Incumbent(np.zeros(6, dtype=np.int64), best * 1.5 + 1, 0.0)
    out = branch_and_bound(problem, time_limit_s=30.0, incumbent=start, relative_gap=0.5)
    assert out.incumbent is not None
    assert out.incumbent.objective <= start.objective
    assert out.best_bound is not None and out.best_bound <= best
    assert out.incumbent.objective - out.best_bound <= 0.5 * out.incumbent.objective + 1e-9


def test_rejects_bad_limits() -> None:
    with pytest.raises(ValueError, match="time_limit_s"):
        branch_and_bound(_problem(0, 0.5), time_limit_s=0.0)
    with pytest.raises(ValueError, match="node_limit"):
        branch_and_bound(_problem(0, 0.5), time_limit_s=1.0, node_limit=-1)
