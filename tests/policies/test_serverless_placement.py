"""Serverless placement (C2CServe, DESIGN.md §3.5): link-budget feasibility,
per-slice HBM fit, large footprints kept apart, the greedy's proof case, and
exact small placements (solver and exhaustive backend against brute force)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from planner.domain.serverless import MigSlice, PlacementParams, ServerlessModel
from planner.policies.serverless import (
    UNPLACED,
    greedy_assignment,
    lexicographic_key,
    plan_placement,
    violation,
)
from planner.profiles.mig import MIG_PROFILES, mig_layout

GB = 10**9
P = MIG_PROFILES


def slices_of(*names: str) -> list[MigSlice]:
    return [MigSlice(f"s{i}", P[n]) for i, n in enumerate(names)]


def model(name, weight_gb, tpot_s, **kw) -> ServerlessModel:
    return ServerlessModel(name, int(weight_gb * GB), tpot_s, **kw)


def assignment_of(plan, models, slices) -> list[int]:
    where = {a.model: a.slice_id for a in plan.assignments}
    index = {s.id: i for i, s in enumerate(slices)}
    return [index[where[m.name]] if m.name in where else UNPLACED for m in models]


def brute_force(models, slices, params) -> tuple[float, float] | None:
    """The best (served weight, -contention) over every assignment."""
    best = None
    for choice in itertools.product(range(-1, len(slices)), repeat=len(models)):
        a = list(choice)
        if violation(models, slices, a, params):
            continue
        v = lexicographic_key(models, slices, a, params)
        best = v if best is None else max(best, v)
    return best


def key_of(plan, models, slices, params) -> tuple[float, float]:
    return lexicographic_key(models, slices, assignment_of(plan, models, slices), params)


def test_demand_is_weights_over_tpot():
    m = model("m", 16, 0.1)
    assert m.c2c_gbps == pytest.approx(160.0)


def test_active_set_never_exceeds_the_link_budget():
    # 4 identical slices, 6 models of 160 GB/s each: a 405 x 0.9 = 364.5 GB/s
    # budget fits two of them.
    models = [model(f"m{i}", 16, 0.1, weight=1.0 + i / 10) for i in range(6)]
    slices = slices_of(*["gh200-4x24gb"] * 4)
    params = PlacementParams(link_gbps=405.0)
    plan = plan_placement(models, slices, params)
    assert plan.feasible
    assert plan.link_demand_gbps <= params.link_budget_gbps
    assert {a.model for a in plan.assignments} == {"m5", "m4"}  # the two most valuable
    assert plan.link_demand_gbps == pytest.approx(320.0)
    assert all("link budget left" in why for _, why in plan.unplaced)
    # The checker agrees and names the link when one more is forced in.
    a = assignment_of(plan, models, slices)
    a[0] = next(s for s in range(4) if s not in a)
    assert "link demand" in violation(models, slices, a, params)


def test_model_over_the_whole_link_is_unplaced_with_reason():
    models = [model("huge", 140, 0.1)]  # 1400 GB/s
    plan = plan_placement(models, slices_of("gh200-1x96gb"), PlacementParams(link_gbps=405.0))
    assert not plan.assignments
    assert "over the link budget" in plan.unplaced[0][1]


def test_hbm_capacity_and_bandwidth_pick_the_slice():
    # needs 30 GB of KV: only the 48 GB slice holds it; needs 1.5 TB/s of
    # HBM: only the 2 TB/s slice serves it.
    models = [
        model("kv-heavy", 8, 0.2, hbm_bytes=30 * GB, weight=2.0),
        model("small", 3, 0.2),
    ]
    slices = slices_of("gh200-3x24gb", "gh200-2x48gb", "gh200-7x12gb")
    plan = plan_placement(models, slices, PlacementParams(link_gbps=405.0))
    where = {a.model: a.slice_id for a in plan.assignments}
    assert where["kv-heavy"] == "s1"
    assert where["small"] in {"s0", "s2"}
    bw = [model("bw", 3, 0.2, hbm_gbps=1500.0)]
    plan = plan_placement(bw, slices, PlacementParams(link_gbps=405.0))
    assert [a.slice_id for a in plan.assignments] == ["s1"]


def test_required_model_unplaceable_is_reported_infeasible():
    models = [model("needs-96", 3, 0.2, hbm_bytes=60 * GB, required=True)]
    plan = plan_placement(models, slices_of("gh200-3x24gb"), PlacementParams(link_gbps=405.0))
    assert not plan.feasible
    assert plan.source == "infeasible"
    assert "fits no slice" in plan.unplaced[0][1]


def test_large_footprints_are_kept_apart():
    # Two 70B-class models (200 GB/s each) cannot stream at once on a 364.5
    # GB/s budget: one slice each is not allowed...
    models = [model("a", 140, 0.7, weight=3.0), model("b", 140, 0.7, weight=3.0)]
    models.append(model("c", 8, 0.1, weight=1.0))
    slices = slices_of("gh200-2x48gb", "gh200-2x48gb")
    one = plan_placement(models, slices, PlacementParams(link_gbps=405.0))
    assert sum(1 for a in one.assignments if a.model in "ab") == 1
    # ... but with two models per slice they share one (taking turns), so
    # the link sees only one of them at a time.
    two = plan_placement(models, slices, PlacementParams(link_gbps=405.0, max_models_per_slice=2))
    where = {a.model: a.slice_id for a in two.assignments}
    assert set(where) == {"a", "b", "c"}
    assert where["a"] == where["b"] != where["c"]
    assert two.link_demand_gbps == pytest.approx(200.0 + 80.0)


def test_greedy_is_proven_on_identical_slices_when_everything_fits():
    models = [model(f"m{i}", 3, 0.2) for i in range(3)]
    slices = [MigSlice(f"s{i}", p) for i, p in enumerate(mig_layout("gh200-7x12gb"))]
    plan = plan_placement(models, slices, PlacementParams(link_gbps=405.0))
    assert plan.source == "greedy-proven" and plan.solve is None
    assert len(plan.assignments) == 3


def test_solver_beats_the_greedy_on_mixed_slices():
    # The greedy places the heavy, valuable model first on the slice adding
    # the least link demand, leaving no room: the solver finds the better set.
    models = [
        model("value", 30, 0.1, weight=3.0),  # 300 GB/s
        model("x", 15, 0.1, weight=2.0),  # 150 GB/s
        model("y", 15, 0.1, weight=2.0),  # 150 GB/s
    ]
    slices = slices_of("gh200-3x24gb", "gh200-3x24gb")
    params = PlacementParams(link_gbps=405.0)
    greedy = greedy_assignment(models, slices, params)
    assert sorted(greedy) == [UNPLACED, UNPLACED, 0] or greedy.count(UNPLACED) == 2
    plan = plan_placement(models, slices, params)
    assert plan.source == "solver"
    assert {a.model for a in plan.assignments} == {"x", "y"}
    assert plan.objective > plan.greedy_objective
    assert plan.solve is not None and plan.solve.status == "OPTIMAL"


def random_instance(seed: int, n_models: int, n_slices: int):
    rng = np.random.default_rng(seed)
    names = list(P)
    slices = [MigSlice(f"s{j}", P[names[rng.integers(len(names))]]) for j in range(n_slices)]
    models = [
        ServerlessModel(
            f"m{i}",
            int(rng.choice([3, 8, 16, 28, 60]) * GB),
            float(rng.choice([0.1, 0.2, 0.4])),
            hbm_bytes=int(rng.uniform(0, 30) * GB),
            hbm_gbps=float(rng.uniform(0, 1500)),
            weight=float(rng.integers(1, 6)),
            required=bool(i == 0 and rng.random() < 0.3),
        )
        for i in range(n_models)
    ]
    return models, slices


@pytest.mark.parametrize("per_slice", [1, 2])
@pytest.mark.parametrize("seed", range(12))
def test_solver_matches_brute_force(seed, per_slice):
    models, slices = random_instance(seed, n_models=4 + seed % 2, n_slices=2 + seed % 2)
    params = PlacementParams(
        link_gbps=405.0, max_models_per_slice=per_slice, method="solver", time_limit_s=10.0
    )
    best = brute_force(models, slices, params)
    plan = plan_placement(models, slices, params)
    if best is None:
        assert not plan.feasible
        return
    assert plan.feasible
    served, neg_contention = key_of(plan, models, slices, params)
    assert served == pytest.approx(best[0], abs=1e-9)
    assert neg_contention == pytest.approx(best[1], abs=1e-5)
    a = assignment_of(plan, models, slices)
    assert violation(models, slices, a, params) == ""


@pytest.mark.parametrize("seed", range(6))
def test_exhaustive_backend_matches_brute_force(seed):
    models, slices = random_instance(100 + seed, n_models=4, n_slices=2)
    params = PlacementParams(link_gbps=405.0, method="solver", backend="exhaustive")
    best = brute_force(models, slices, params)
    plan = plan_placement(models, slices, params)
    if best is None:
        assert not plan.feasible
        return
    assert plan.solve is not None and plan.solve.backend == "exhaustive"
    assert key_of(plan, models, slices, params) == pytest.approx(best, abs=1e-9)


def test_placement_is_deterministic_and_fast_enough_for_87_models():
    models, _ = random_instance(7, n_models=87, n_slices=1)
    slices = mig_layout("gh200-7x12gb")
    slices = [MigSlice(f"s{i}", s) for i, s in enumerate(slices)]
    params = PlacementParams(link_gbps=405.0, time_limit_s=2.0)
    a = plan_placement(models, slices, params)
    b = plan_placement(models, slices, params)
    assert a.assignments == b.assignments
    assert a.feasible and a.link_demand_gbps <= params.link_budget_gbps
    assert a.objective >= a.greedy_objective - 1e-9


def test_a_backend_that_cannot_take_the_model_hands_over_to_cpsat():
    models, slices = random_instance(3, n_models=30, n_slices=3)
    params = PlacementParams(link_gbps=405.0, method="solver", backend="exhaustive")
    plan = plan_placement(models, slices, params)
    assert plan.solve is not None and plan.solve.backend == "cpsat"
    assert "fell back from exhaustive to cpsat" in plan.solve.note
    assert plan.source in {"solver", "greedy-fallback"}


def test_very_large_instances_get_the_greedy_only():
    models = [model(f"m{i}", 1 + i % 50, 0.1, weight=1.0 + i % 7) for i in range(3000)]
    slices = [MigSlice(f"s{i}", p) for i, p in enumerate(mig_layout("gh200-7x12gb"))]
    plan = plan_placement(models, slices, PlacementParams(link_gbps=405.0))
    assert plan.source == "greedy" and plan.solve is None
    assert "greedy only" in plan.summary and plan.feasible
