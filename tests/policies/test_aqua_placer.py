"""AQUA-PLACER: exact small placements against brute force over every
assignment, both objectives, TP shards, capacity, warm start and max_moves."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from planner.domain.placement import PlacedModel, PlacementInputs, PlacerObjective
from planner.policies.aqua.placer import (
    eq_lower_bound,
    evaluate,
    fits,
    greedy_placement,
    improve,
    lower_bound_bytes,
    paired_placement,
    place_models,
    polish,
)
from planner.policies.aqua.placer_counts import deal, min_eq_counts

GB = 10**9


def brute_force(inputs: PlacementInputs) -> float:
    return min(
        evaluate(inputs, a)[0]
        for a in itertools.product(range(inputs.num_servers), repeat=len(inputs.models))
        if fits(inputs, a)
    )


def test_balanced_example_pairs_producers_with_consumers():
    models = (
        PlacedModel("audiogen", 20 * GB),
        PlacedModel("llama70b", -15 * GB, shards=2),
        PlacedModel("sd3", 10 * GB),
        PlacedModel("yi34b", -12 * GB),
        PlacedModel("llama8b", 5 * GB, shards=2),
        PlacedModel("opt30b", -8 * GB),
    )
    inputs = PlacementInputs(models, num_servers=3, gpus_per_server=4, gpu_memory_bytes=80 * GB)
    p = place_models(inputs)
    assert p.status == "OPTIMAL" and not p.fallback
    assert p.objective_bytes == brute_force(inputs) == 10 * GB
    # Every server has as many producer GPUs as consumer GPUs.
    assert p.eq == (0, 0, 0)
    assert max(abs(m) for m in p.mem_bytes) == 10 * GB
    assert p.gap == 0.0


@pytest.mark.parametrize("objective", list(PlacerObjective))
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_exact_matches_brute_force(objective, data):
    n = data.draw(st.integers(2, 6))
    servers = data.draw(st.integers(2, 3))
    gpus = data.draw(st.integers(2, 4))
    models = []
    for i in range(n):
        r = data.draw(st.integers(-20, 20)) * GB
        shards = data.draw(st.integers(1, 2))
        current = data.draw(st.one_of(st.none(), st.integers(0, servers - 1)))
        models.append(PlacedModel(f"m{i}", r, shards, current))
    inputs = PlacementInputs(
        tuple(models),
        servers,
        gpus,
        40 * GB,
        objective=objective,
        max_moves=data.draw(st.one_of(st.none(), st.integers(0, 2))),
    )
    if sum(m.shards for m in models) > servers * gpus:
        return
    try:
        best = brute_force(inputs)
    except ValueError:  # nothing fits
        with pytest.raises(ValueError):
            place_models(inputs)
        return
    p = place_models(inputs, time_limit_s=10.0)
    assert p.status == "OPTIMAL"
    assert p.objective_bytes == pytest.approx(best)
    assert fits(inputs, p.servers)
    ex = place_models(inputs, backend="exhaustive")
    assert ex.objective_bytes == pytest.approx(best)


def test_paper_objective_is_the_literal_variant():
    # One producer, three consumers, two servers of 3 GPUs. Ours: the best
    # split is {p, c, c} {c}: max |mem| 10 GB + 80 GB x max |eq| 1 = 90 GB.
    # The paper's max_s mem_s + G max_s eq_s counts only surplus, so the same
    # split scores -10 - 80 = -90 GB: deficits look like a gain.
    models = (
        PlacedModel("p", 10 * GB),
        PlacedModel("c1", -10 * GB),
        PlacedModel("c2", -10 * GB),
        PlacedModel("c3", -10 * GB),
    )
    ours = PlacementInputs(models, 2, 3, 80 * GB)
    paper = PlacementInputs(models, 2, 3, 80 * GB, objective=PlacerObjective.PAPER)
    a, b = place_models(ours), place_models(paper)
    assert a.objective_bytes == brute_force(ours) == 90 * GB
    assert b.objective_bytes == brute_force(paper) == -90 * GB
    assert sorted(a.eq) == [-1, -1]


def test_warm_start_keeps_the_current_placement_and_max_moves_caps_moves():
    # All producers on server 0, all consumers on 1: a bad placement.
    models = tuple(
        [PlacedModel(f"p{i}", 10 * GB, current_server=0) for i in range(2)]
        + [PlacedModel(f"c{i}", -10 * GB, current_server=1) for i in range(2)]
    )
    base = {"num_servers": 2, "gpus_per_server": 2, "gpu_memory_bytes": 80 * GB}
    free = place_models(PlacementInputs(models, **base))
    assert free.moves == 2 and free.eq == (0, 0)
    capped = place_models(PlacementInputs(models, **base, max_moves=0))
    assert capped.moves == 0 and capped.servers == (0, 0, 1, 1)
    # Moving is not worth it when it costs more than the imbalance saves.
    costly = place_models(PlacementInputs(models, **base, move_cost_bytes=10**15))
    assert costly.moves == 0


def test_no_solution_in_time_returns_the_warm_start():
    models = tuple(
        PlacedModel(f"m{i}", (i % 7 - 3) * GB, 1 + i % 2, current_server=i % 16) for i in range(64)
    )
    inputs = PlacementInputs(models, 16, 8, 80 * GB)
    p = place_models(inputs, time_limit_s=1e-4)
    # Too little time to even hand the model to the solver: the warm start
    # (the current placement) comes back, marked.
    assert p.fallback and "warm start" in p.note
    assert p.servers == tuple(m.current_server for m in models)
    assert fits(inputs, p.servers)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(-30, 30), st.integers(1, 2)), min_size=1, max_size=20))
def test_local_search_never_worsens_the_greedy_placement(spec):
    assume(sum(shards for _, shards in spec) <= 4 * 8)  # the cluster's GPUs
    models = tuple(PlacedModel(f"m{i}", r * GB, k) for i, (r, k) in enumerate(spec))
    inputs = PlacementInputs(models, 4, 8, 80 * GB)
    start = greedy_placement(inputs)
    assert start is not None and fits(inputs, start)
    better = improve(inputs, start)
    assert fits(inputs, better)
    assert evaluate(inputs, better)[0] <= evaluate(inputs, start)[0]


def test_greedy_and_impossible_inputs():
    inputs = PlacementInputs((PlacedModel("big", 1, shards=5),), 2, 4, GB)
    with pytest.raises(ValueError, match="do not fit"):
        place_models(inputs)
    ok = PlacementInputs(tuple(PlacedModel(f"m{i}", GB) for i in range(4)), 2, 2, GB)
    assert sorted(greedy_placement(ok) or []) == [0, 0, 1, 1]


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-30, 30), st.sampled_from([1, 2])), min_size=1, max_size=7),
    st.integers(2, 3),
)
def test_bounds_counts_and_polish_against_brute_force(spec, servers):
    assume(sum(k for _, k in spec) <= servers * 4)
    models = tuple(PlacedModel(f"m{i}", r * GB, k) for i, (r, k) in enumerate(spec))
    inputs = PlacementInputs(models, servers, 4, 80 * GB)
    feasible = [a for a in itertools.product(range(servers), repeat=len(models)) if fits(inputs, a)]
    assume(feasible)
    best = min(evaluate(inputs, a)[0] for a in feasible)
    least_e = min(max(abs(v) for v in evaluate(inputs, a)[2]) for a in feasible)
    bound = lower_bound_bytes(inputs)
    assert bound is not None and bound <= best
    assert eq_lower_bound(inputs) <= least_e
    counts = min_eq_counts(inputs, eq_lower_bound(inputs), 5.0)
    assert counts is not None and counts.proved and counts.e == least_e
    dealt = deal(inputs, counts)
    assert fits(inputs, dealt) and max(abs(v) for v in evaluate(inputs, dealt)[2]) == least_e
    polished = polish(inputs, dealt)
    assert fits(inputs, polished)
    assert evaluate(inputs, polished)[0] <= evaluate(inputs, dealt)[0]
    paired = paired_placement(inputs)
    if paired is not None:
        assert fits(inputs, paired)
