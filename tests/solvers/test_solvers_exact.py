"""Small models with known answers, on every backend."""

from __future__ import annotations

import importlib.util
import itertools

import numpy as np
import pytest
from planner.solvers import Backend, Model, Status, solve

needs_gurobi = pytest.mark.skipif(
    importlib.util.find_spec("gurobipy") is None, reason="gurobipy not installed"
)

BACKENDS = [
    pytest.param("cpsat", id="cpsat"),
    pytest.param("exhaustive", id="exhaustive"),
    pytest.param("gurobi", id="gurobi", marks=needs_gurobi),
]


def _check(result, objective, backend):
    assert result.status is Status.OPTIMAL, result.note
    assert result.backend is Backend(backend)
    assert result.objective == pytest.approx(objective, rel=1e-6, abs=1e-6)
    assert result.best_bound == pytest.approx(objective, rel=1e-6, abs=1e-6)
    assert result.gap == 0.0
    assert result.max_violation <= 1e-6
    assert result.wall_time_s > 0
    assert result.time_limit_s == 5.0


def test_knapsack_answer_by_hand():
    best = max(
        sum(v for v, t in zip([1, 5, 5, 10, 13], take, strict=True) if t)
        for take in itertools.product([0, 1], repeat=5)
        if sum(w for w, t in zip([3, 4, 5, 8, 9], take, strict=True) if t) <= 20
    )
    assert best == 24


@pytest.mark.parametrize("backend", BACKENDS)
def test_knapsack(backend):
    m = Model()
    x = m.add_binaries(5)
    m.add_linear(x, [3, 4, 5, 8, 9], "<=", 20)
    m.maximize(x, [1, 5, 5, 10, 13])
    r = solve(m, time_limit_s=5.0, backend=backend)
    _check(r, 24, backend)  # items 0, 3, 4: weight 3 + 8 + 9 = 20, value 1 + 10 + 13
    assert r.value(x).round().tolist() == [1, 0, 0, 1, 1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_hot_assignment_with_capacity(backend):
    m = Model()
    cost = np.array([[4, 1, 3], [2, 0, 5], [3, 2, 2]], float)
    load = np.array([[1, 3, 2], [1, 3, 2], [1, 3, 2]], float)
    x = m.add_binaries(9).reshape(3, 3)
    m.add_exactly_one_groups(x)
    m.add_linear(x.ravel(), load.ravel(), "<=", 6)
    m.minimize(x.ravel(), cost.ravel())
    r = solve(m, time_limit_s=5.0, backend=backend)
    best = min(
        cost[range(3), pick].sum()
        for pick in itertools.product(range(3), repeat=3)
        if load[range(3), pick].sum() <= 6
    )
    assert best == 5  # the unconstrained best, 1 + 0 + 2, loads 8
    _check(r, best, backend)
    chosen = r.value(x).round()
    assert (chosen.sum(axis=1) == 1).all()
    assert (chosen * load).sum() <= 6


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_and_continuous_envelope(backend):
    """min |x - 3.3| over integer x in [0, 10], written as y >= +-(x - 3.3)."""
    m = Model()
    x = m.add_integers(1, 0, 10)
    y = m.add_continuous(1, 0.0, 20.0)
    m.add_max_lower_bound(y[0], [[1.0], [-1.0]], x, [-3.3, 3.3])
    m.minimize(y, 1.0)
    r = solve(m, time_limit_s=5.0, backend=backend)
    assert r.status is Status.OPTIMAL
    assert r.value(x)[0] == 3
    # CP-SAT sees y on a grid of 2**-16 (range 20 / 2**20, down to a power of two).
    assert r.objective == pytest.approx(0.3, abs=2.0**-16)


@pytest.mark.parametrize("backend", BACKENDS)
def test_infeasible(backend):
    m = Model()
    x = m.add_binaries(3).reshape(1, 3)
    m.add_exactly_one_groups(x)
    m.add_linear(x.ravel(), [1, 1, 1], ">=", 2)
    m.minimize(x.ravel(), [1, 1, 1])
    r = solve(m, time_limit_s=5.0, backend=backend)
    assert r.status is Status.INFEASIBLE
    assert r.objective is None and r.values is None and r.gap is None
    assert not r.has_solution


@pytest.mark.parametrize("backend", BACKENDS)
def test_equality_with_non_dyadic_coefficients(backend):
    m = Model()
    a = m.add_integers(1, 0, 3)
    b = m.add_integers(1, 0, 3)
    m.add_linear([a[0], b[0]], [0.1, 0.2], "==", 0.3)
    m.minimize(a, 1.0, constant=10.0)
    r = solve(m, time_limit_s=5.0, backend=backend)
    _check(r, 11.0, backend)
    assert r.value(b)[0] == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_maximize_with_negative_coefficients_and_offset(backend):
    m = Model()
    x = m.add_integers(3, -2, 2)
    m.add_linear(x, [1, 1, 1], "==", 1)
    m.add_linear(x[:2], [1, -1], ">=", 1)
    m.maximize(x, [-1.5, 2.0, 0.25], constant=-1.0)
    r = solve(m, time_limit_s=5.0, backend=backend)
    # x0 - x1 >= 1, x0 + x1 + x2 = 1; best: x0=-1, x1=-2, x2=2 -> 1.5 - 4 + 0.5 - 1
    # or x0 = 0, x1 = -1, x2 = 2 -> 0 - 2 + 0.5 - 1 = -2.5 (better)
    _check(r, -2.5, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_objective_is_feasibility(backend):
    m = Model()
    x = m.add_binaries(2)
    m.add_linear(x, [1, 1], "==", 1)
    r = solve(m, time_limit_s=5.0, backend=backend)
    assert r.status is Status.OPTIMAL
    assert r.objective == 0.0
    assert r.value(x).sum() == 1
