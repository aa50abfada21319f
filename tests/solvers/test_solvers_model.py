"""The formulation API: shapes, validation, evaluation."""

from __future__ import annotations

import numpy as np
import pytest
from planner.solvers import Model, Sense, VarType


def test_ids_are_consecutive_and_typed():
    m = Model()
    x = m.add_binaries(3)
    y = m.add_integers(2, -1, 4)
    z = m.add_continuous(1, 0.0, 2.5)
    assert x.tolist() == [0, 1, 2]
    assert y.tolist() == [3, 4]
    assert z.tolist() == [5]
    f = m.frozen()
    assert f.vtype.tolist() == [0, 0, 0, 1, 1, 2]
    assert f.lb.tolist() == [0, 0, 0, -1, -1, 0.0]
    assert f.ub.tolist() == [1, 1, 1, 4, 4, 2.5]
    assert m.num_vars == 6


def test_default_resolution_is_power_of_two_below_range():
    m = Model()
    m.add_continuous(1, 0.0, 1.0)
    m.add_continuous(1, 0.0, 3.0, resolution=0.01)
    res = m.frozen().resolution
    assert res[0] == 2.0**-20
    assert res[1] == 0.01


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda m: m.add_integers(1, 0, np.inf), ValueError),
        (lambda m: m.add_integers(1, 3, 2), ValueError),
        (lambda m: m.add_integers(1, 0.2, 0.8), ValueError),
        (lambda m: m.add_vars(1, VarType.BINARY, 0, 2), ValueError),
        (lambda m: m.add_continuous(1, 0, 1, resolution=0), ValueError),
        (lambda m: m.add_linear([0, 9], [1, 1], "<=", 1), IndexError),
        (lambda m: m.add_linear([0], [1], "<", 1), ValueError),
        (lambda m: m.add_linear([0], [np.nan], "<=", 1), ValueError),
        (lambda m: m.add_linear([0.5], [1], "<=", 1), TypeError),
        (lambda m: m.add_exactly_one([0, 0]), ValueError),
        (lambda m: m.add_exactly_one([0, 3]), ValueError),  # 3 is an integer variable
        (lambda m: m.add_rows(np.ones(3), [0, 1, 2], "<=", 1), ValueError),
        (lambda m: m.add_rows(np.ones((2, 2)), [0, 1, 2], "<=", 1), ValueError),
    ],
)
def test_bad_input_is_refused(call, error):
    m = Model()
    m.add_binaries(3)
    m.add_integers(1, 0, 5)
    with pytest.raises(error):
        call(m)


def test_rows_from_matrix_drop_zeros_and_keep_order():
    m = Model()
    x = m.add_binaries(3)
    rows = m.add_rows([[1.0, 0.0, 2.0], [0.0, 0.0, 0.0], [0.0, 3.0, 0.0]], x, ">=", [1, 0, 2])
    assert rows.tolist() == [0, 1, 2]
    r = m.frozen().rows
    assert r.start.tolist() == [0, 2, 2, 3]
    assert r.vars.tolist() == [0, 2, 1]
    assert r.coefs.tolist() == [1.0, 2.0, 3.0]
    assert (r.sense == Sense.GE).all()
    assert r.activity(np.array([1.0, 1.0, 1.0])).tolist() == [3.0, 0.0, 3.0]


def test_max_lower_bound_rows():
    m = Model()
    x = m.add_binaries(2)
    y = m.add_continuous(1, 0.0, 10.0)[0]
    stall = m.add_continuous(2, 0.0, 10.0)
    m.add_max_lower_bound(y, [[1.0, 2.0], [3.0, 0.0]], x, [0.5, -1.0])  # y >= max(row) + c
    m.add_max_lower_bound(stall, [[1.0, 1.0], [0.0, 4.0]], x, -1.0)  # row-wise
    values = np.array([1.0, 1.0, 3.5, 1.0, 3.0])
    assert m.max_violation(values) == 0.0
    values[2] = 3.0  # y below 1 + 2 + 0.5
    assert m.max_violation(values) > 0
    r = m.frozen().rows
    assert r.count == 4
    assert r.vars[r.start[2] : r.start[3]].tolist() == [3, 0, 1]
    assert r.coefs[r.start[2] : r.start[3]].tolist() == [1.0, -1.0, -1.0]


def test_groups_and_objective_evaluation():
    m = Model()
    x = m.add_binaries(6).reshape(2, 3)
    m.add_exactly_one_groups(x)
    m.add_exactly_one_groups([np.array([0, 5])])  # lists of arrays work too
    assert m.num_constraints == 3
    m.minimize(x.ravel(), [1, 2, 3, 4, 5, 6], constant=0.5)
    values = np.array([1, 0, 0, 0, 1, 0], dtype=float)
    assert m.objective_value(values) == 1 + 5 + 0.5
    assert m.max_violation(values) == 0.0
    values[3] = 1.0  # second group has two ones
    assert m.max_violation(values) == pytest.approx(1.0)


def test_objective_sums_duplicates_and_cache_invalidates():
    m = Model()
    x = m.add_binaries(2)
    m.maximize([0, 0, 1], [1.0, 2.0, 1.0])
    first = m.frozen()
    assert first.objective.tolist() == [3.0, 1.0]
    assert first.maximize
    m.add_linear(x, [1, 1], "<=", 1)
    assert m.frozen() is not first
    assert m.frozen() is m.frozen()
