"""AQUA-PLACER's two phases (least max |eq| by configurations, then memory
balanced under that cap) and the bound they report, against brute force."""

from __future__ import annotations

import itertools
import time

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from planner.domain.placement import PlacedModel, PlacementInputs, PlacerObjective
from planner.policies.aqua.placer import eq_lower_bound, evaluate, fits, place_models
from planner.policies.aqua.placer_balance import balance_memory, mem_floor_mb
from planner.policies.aqua.placer_counts import deal
from planner.policies.aqua.placer_patterns import min_eq_patterns

GB = 10**9
MB = 10**6

small_specs = st.lists(
    st.tuples(st.integers(-30, 30), st.sampled_from([1, 2])), min_size=1, max_size=7
)


def _feasible(inputs: PlacementInputs) -> list[tuple[int, ...]]:
    return [
        a
        for a in itertools.product(range(inputs.num_servers), repeat=len(inputs.models))
        if fits(inputs, a)
    ]


def _max_eq(inputs: PlacementInputs, servers: tuple[int, ...] | list[int]) -> int:
    return max(abs(v) for v in evaluate(inputs, servers)[2])


def _max_mem(inputs: PlacementInputs, servers: tuple[int, ...] | list[int]) -> int:
    return max(abs(v) for v in evaluate(inputs, servers)[1])


@settings(max_examples=30, deadline=None)
@given(small_specs, st.integers(2, 3))
def test_patterns_find_the_least_max_eq_and_deal_reaches_it(spec, servers):
    models = tuple(PlacedModel(f"m{i}", r * GB, k) for i, (r, k) in enumerate(spec))
    inputs = PlacementInputs(models, servers, 4, 80 * GB)
    feasible = _feasible(inputs)
    assume(feasible)
    least_e = min(_max_eq(inputs, a) for a in feasible)
    counts = min_eq_patterns(inputs, eq_lower_bound(inputs), 99, time.perf_counter() + 5)
    assert counts is not None and counts.proved and counts.e == least_e
    dealt = deal(inputs, counts)
    assert fits(inputs, dealt) and _max_eq(inputs, dealt) == least_e


@settings(max_examples=30, deadline=None)
@given(small_specs, st.integers(2, 3))
def test_balance_keeps_the_cap_and_never_worsens(spec, servers):
    models = tuple(PlacedModel(f"m{i}", r * GB, k) for i, (r, k) in enumerate(spec))
    inputs = PlacementInputs(models, servers, 4, 80 * GB)
    feasible = _feasible(inputs)
    assume(feasible)
    start = feasible[-1]
    cap = _max_eq(inputs, start)
    best = min(_max_mem(inputs, a) for a in feasible if _max_eq(inputs, a) <= cap)
    out = balance_memory(inputs, start, cap, best // MB, time.perf_counter() + 0.05)
    assert fits(inputs, out)
    assert _max_eq(inputs, out) <= cap
    assert _max_mem(inputs, out) <= _max_mem(inputs, start)
    # With two servers one pair re-split is exhaustive: the least max |mem|
    # among placements under the cap.
    if servers == 2:
        assert _max_mem(inputs, out) == best


def test_memory_floor_is_the_mean_rounded_up_to_the_gcd():
    models = tuple(PlacedModel(f"m{i}", r * GB) for i, r in enumerate((30, 20, -10, 15)))
    # Sum 55 GB over 2 servers: mean 27.5 GB; every mem_s is a multiple of 5 GB.
    assert mem_floor_mb(PlacementInputs(models, 2, 4, 80 * GB)) == 30_000
    assert mem_floor_mb(PlacementInputs(models, 5, 4, 80 * GB)) == 15_000


def test_balance_reaches_the_floor_on_a_perfectly_divisible_case():
    # 4 servers, pairs (+a, -b) with 1 GPU each: a placement with every
    # server at mem 5 GB and eq 0 exists; start from one far from it.
    values = [(30, -25), (12, -7), (40, -35), (9, -4)]
    models = tuple(
        PlacedModel(f"m{2 * i + j}", v * GB)
        for i, pair in enumerate(values)
        for j, v in enumerate(pair)
    )
    inputs = PlacementInputs(models, 4, 2, 80 * GB)
    start = [0, 1, 1, 0, 2, 3, 3, 2]
    assert fits(inputs, start) and _max_eq(inputs, start) == 0
    out = balance_memory(inputs, start, 0, mem_floor_mb(inputs), time.perf_counter() + 5)
    assert _max_mem(inputs, out) == 5 * GB == mem_floor_mb(inputs) * MB


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-30, 30), st.sampled_from([1, 2])), min_size=1, max_size=6),
    st.integers(2, 3),
    st.sampled_from(list(PlacerObjective)),
    st.floats(0.005, 0.5),
)
def test_reported_bound_never_exceeds_the_optimum(spec, servers, objective, limit):
    """Whatever the time limit: the placement fits, its objective is what
    evaluate says, and the bound it reports is at most the brute-force
    optimum (so the reported gap is never optimistic)."""
    models = tuple(PlacedModel(f"m{i}", r * GB, k) for i, (r, k) in enumerate(spec))
    inputs = PlacementInputs(models, servers, 4, 80 * GB, objective=objective)
    feasible = _feasible(inputs)
    assume(feasible)
    optimum = min(evaluate(inputs, a)[0] for a in feasible)
    p = place_models(inputs, time_limit_s=limit)
    assert fits(inputs, p.servers)
    assert p.objective_bytes == evaluate(inputs, p.servers)[0] >= optimum
    if p.best_bound_bytes is not None:
        assert p.best_bound_bytes <= optimum + 1e-6 * abs(optimum) + 1
        assert p.gap is not None and p.gap >= 0
    if p.status == "OPTIMAL":
        assert p.objective_bytes == optimum
