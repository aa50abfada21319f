"""The least cost of freeing memory (the multiple-choice knapsack's LP
relaxation): a worked example, and never above the integer optimum."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.policies.offload.cover_bound import cover_curve


def test_one_request_follows_its_lower_hull():
    # Patterns: nothing, (10 freed, cost 10), (20, 12), (30, 30). The hull
    # from (0, 0) skips (10, 10): 0.6 per block up to 20, then 1.8.
    freed = np.array([[0.0, 10.0, 20.0, 30.0]])
    cost = np.array([[0.0, 10.0, 12.0, 30.0]])
    curve = cover_curve(freed, cost, np.array([0]))
    assert curve.at(0, np.array([10.0, 20.0, 25.0, 30.0])).tolist() == [6.0, 12.0, 21.0, 30.0]
    assert np.isinf(curve.at(0, np.array([31.0]))[0])
    assert curve.at(0, np.array([-5.0]))[0] == 0.0
    assert curve.at(1, np.array([0.0]))[0] == 0.0  # nobody left, nothing needed


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(2, 4),
    st.integers(0, 10_000),
)
def test_never_above_the_integer_optimum(requests, choices, seed):
    rng = np.random.default_rng(seed)
    freed = rng.integers(0, 40, (requests, choices)).astype(np.float64)
    cost = rng.integers(0, 40, (requests, choices)).astype(np.float64)
    freed[:, 0] = cost[:, 0] = 0.0
    order = np.arange(requests)
    curve = cover_curve(freed, cost, order)
    for need in (0.0, 5.0, 17.0, 33.0, 60.0):
        best = np.inf
        for combo in itertools.product(range(choices), repeat=requests):
            rows = np.arange(requests)
            if freed[rows, combo].sum() >= need:
                best = min(best, cost[rows, combo].sum())
        relaxed = curve.at(0, np.array([need]))[0]
        assert relaxed <= best + 1e-9
        if np.isinf(best):
            assert need > freed.max(axis=1).sum()
