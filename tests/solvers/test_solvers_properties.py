"""Random small one-hot ILPs: CP-SAT agrees with exhaustive enumeration."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planner.solvers import Model, SolveOptions, Status, solve

needs_gurobi = pytest.mark.skipif(
    importlib.util.find_spec("gurobipy") is None, reason="gurobipy not installed"
)

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def one_hot_models(draw, floats=False, envelope=False):
    """Groups of one-hot binaries, a free binary, an integer, 1-3 random rows,
    optionally y >= rows (continuous), integer or float data."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    groups = draw(st.integers(1, 3))
    choices = draw(st.integers(1, 4))
    n_rows = draw(st.integers(1, 3))
    m = Model()
    x = m.add_binaries(groups * choices).reshape(groups, choices)
    m.add_exactly_one_groups(x)
    free = m.add_binaries(1)
    k = m.add_integers(1, -2, 3)
    disc = np.concatenate([x.ravel(), free, k])

    def data(shape):
        if floats:
            return np.round(rng.uniform(-5, 5, shape), 3)
        return rng.integers(-5, 6, shape).astype(float)

    a = data((n_rows, len(disc)))
    b = data(n_rows) + rng.integers(0, 6, n_rows)
    sense = draw(st.lists(st.sampled_from(["<=", ">=", "=="]), min_size=n_rows, max_size=n_rows))
    for i in range(n_rows):
        if sense[i] == "==" and floats:
            sense[i] = "<="  # float equalities are almost never satisfiable
        m.add_linear(disc, a[i], sense[i], b[i])
    obj_vars, obj = disc, data(len(disc))
    if envelope:
        y = m.add_continuous(2, 0.0, 100.0)
        m.add_max_lower_bound(y[0], data((2, len(disc))), disc, data(2))
        m.add_max_lower_bound(y[1], data((1, len(disc))), disc, data(1))
        obj_vars, obj = np.concatenate([disc, y]), np.concatenate([obj, [1.0, 2.0]])
    if draw(st.booleans()):
        m.maximize(obj_vars, obj if not envelope else -obj)
    else:
        m.minimize(obj_vars, obj)
    return m


def _agree(m, tol, other="cpsat"):
    ref = solve(m, time_limit_s=10.0, backend="exhaustive")
    got = solve(m, time_limit_s=10.0, backend=other)
    assert ref.status in (Status.OPTIMAL, Status.INFEASIBLE)
    assert got.status is ref.status, got.note
    if ref.status is Status.OPTIMAL:
        assert got.objective == pytest.approx(ref.objective, rel=tol, abs=tol)
        assert got.max_violation <= 1e-6
        assert ref.max_violation <= 1e-6
        # The reported values reproduce the reported objective.
        assert m.objective_value(got.values) == pytest.approx(got.objective)


@SETTINGS
@given(one_hot_models())
def test_cpsat_matches_exhaustive_integer_data(m):
    _agree(m, 1e-9)


@SETTINGS
@given(one_hot_models(floats=True))
def test_cpsat_matches_exhaustive_float_data(m):
    _agree(m, 1e-5)


@SETTINGS
@given(one_hot_models(envelope=True))
def test_cpsat_matches_exhaustive_with_continuous_envelope(m):
    # y lives on CP-SAT's grid of 2**-14 (range 100 / 2**20, down to a power of two).
    _agree(m, 3 * 2.0**-14)


@needs_gurobi
@settings(max_examples=25, deadline=None)
@given(one_hot_models(floats=True, envelope=True))
def test_gurobi_matches_exhaustive(m):
    _agree(m, 1e-5, other="gurobi")


@SETTINGS
@given(one_hot_models())
def test_single_thread_and_default_threads_agree(m):
    one = solve(m, time_limit_s=10.0, options=SolveOptions(threads=1))
    many = solve(m, time_limit_s=10.0, options=SolveOptions(threads=0))
    assert one.status is many.status
    if one.status is Status.OPTIMAL:
        assert one.objective == pytest.approx(many.objective)
