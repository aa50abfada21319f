"""AQUA-PLACER's memory window proof (placer_window.py) and the bound the
phases report with it, against brute force."""

from __future__ import annotations

import itertools
import time

from hypothesis import assume, given, settings
from hypothesis import strategies as st
from planner.solvers import Status

from planner.domain.placement import PlacedModel, PlacementInputs
from planner.policies.aqua.placer import evaluate, fits, place_models
from planner.policies.aqua.placer_balance import mem_floor_mb
from planner.policies.aqua.placer_phases import Phased, phased_bound_mb
from planner.policies.aqua.placer_window import feasible_at, max_abs_mem_mb, prove_memory, window

GB = 10**9
MB = 10**6


def _max_eq(inputs: PlacementInputs, servers: tuple[int, ...] | list[int]) -> int:
    return max(abs(v) for v in evaluate(inputs, servers)[2])


def _under_cap(inputs: PlacementInputs, cap: int) -> list[tuple[int, ...]]:
    return [
        a
        for a in itertools.product(range(inputs.num_servers), repeat=len(inputs.models))
        if fits(inputs, a) and _max_eq(inputs, a) <= cap
    ]


def test_window_is_the_range_a_server_can_take():
    # 93 GB over 16 servers, every |mem| <= 6: the other 15 hold at most 90.
    assert window(93_000, 16, 6_000) == (3_000, 6_000)
    assert window(-93_000, 16, 6_000) == (-6_000, -3_000)
    assert window(37_000, 8, 13_000) == (-13_000, 13_000)
    # Below the mean no server can take anything.
    lo, hi = window(93_000, 16, 5_000)
    assert lo > hi


def test_proof_raises_the_floor_where_full_servers_cannot_balance():
    # Two 4-GPU servers, a 4-shard producer of 40 GB and a 4-shard consumer
    # of 11 GB: each fills a server, so max |mem| is 40 GB whatever the
    # placement, far above the mean (14.5 GB, 15 in whole GB).
    models = (PlacedModel("p", 40 * GB, 4), PlacedModel("c", -11 * GB, 4))
    inputs = PlacementInputs(models, 2, 4, 80 * GB)
    assert mem_floor_mb(inputs) == 15_000
    proof = prove_memory(inputs, [0, 1], 4, mem_floor_mb(inputs), time.perf_counter() + 5)
    assert proof.floor_mb == 40_000 == max_abs_mem_mb(inputs, proof.servers)
    # From the floor up, one GB per proof, until the proof meets the placement.
    assert proof.thresholds == tuple((t, "INFEASIBLE") for t in range(15_000, 40_000, 1_000))
    phased = Phased(proof.servers, 4, proof.floor_mb)
    # 40 + 80 x 4 GB with max |eq| = 4; a placement with max |eq| >= 5 would
    # pay 15 + 80 x 5 = 415 GB at least.
    assert phased_bound_mb(inputs, phased) == 360_000


def test_proof_finds_a_better_placement_and_proves_it():
    # Three 2-GPU servers, pairs that balance only when re-matched: start
    # from the worst matching; the optimum puts each producer with the
    # consumer of the same size (every |mem| = 1 GB).
    values = [31, -30, 21, -20, 11, -10]
    models = tuple(PlacedModel(f"m{i}", v * GB) for i, v in enumerate(values))
    inputs = PlacementInputs(models, 3, 2, 80 * GB)
    start = [0, 1, 1, 2, 2, 0]  # +31-10, +21-30, +11-20: max |mem| 21 GB
    assert fits(inputs, start) and _max_eq(inputs, start) == 0
    proof = prove_memory(inputs, start, 0, mem_floor_mb(inputs), time.perf_counter() + 5)
    assert max_abs_mem_mb(inputs, proof.servers) == proof.floor_mb == 1_000
    assert fits(inputs, proof.servers) and _max_eq(inputs, proof.servers) == 0


def test_feasible_at_answers_infeasible_below_the_mean_without_solving():
    models = (PlacedModel("a", 10 * GB), PlacedModel("b", 10 * GB))
    inputs = PlacementInputs(models, 2, 4, 80 * GB)
    assert feasible_at(inputs, 2, 9_000, 1.0) == (Status.INFEASIBLE, None)
    status, servers = feasible_at(inputs, 2, 10_000, 1.0)
    assert status is Status.OPTIMAL and servers is not None
    assert max_abs_mem_mb(inputs, servers) == 10_000


small_specs = st.lists(
    st.tuples(st.integers(-30, 30).filter(bool), st.sampled_from([1, 2])), min_size=1, max_size=6
)


@settings(max_examples=30, deadline=None)
@given(small_specs, st.integers(2, 3), st.integers(0, 2))
def test_proof_is_exact_on_small_cases(spec, servers, extra_cap):
    """With time enough: the placement fits, keeps the cap, and its max |mem|
    equals the proved floor and the brute-force optimum under the cap."""
    models = tuple(PlacedModel(f"m{i}", r * GB, k) for i, (r, k) in enumerate(spec))
    inputs = PlacementInputs(models, servers, 4, 80 * GB)
    feasible = _under_cap(inputs, 99)
    assume(feasible)
    cap = min(_max_eq(inputs, a) for a in feasible) + extra_cap
    under = _under_cap(inputs, cap)
    optimum = min(max_abs_mem_mb(inputs, a) for a in under)
    start = max(under, key=lambda a: max_abs_mem_mb(inputs, a))
    proof = prove_memory(inputs, start, cap, mem_floor_mb(inputs), time.perf_counter() + 10)
    assert fits(inputs, proof.servers) and _max_eq(inputs, proof.servers) <= cap
    assert proof.floor_mb == max_abs_mem_mb(inputs, proof.servers) == optimum


@settings(max_examples=30, deadline=None)
@given(small_specs, st.integers(2, 3), st.floats(0.0, 0.05))
def test_a_cut_short_proof_never_claims_too_much(spec, servers, budget):
    """Whatever the time: the floor it reports is at most the optimum under
    the cap and the placement is never worse than the start."""
    models = tuple(PlacedModel(f"m{i}", r * GB, k) for i, (r, k) in enumerate(spec))
    inputs = PlacementInputs(models, servers, 4, 80 * GB)
    feasible = _under_cap(inputs, 99)
    assume(feasible)
    start = feasible[-1]
    cap = _max_eq(inputs, start)
    optimum = min(max_abs_mem_mb(inputs, a) for a in _under_cap(inputs, cap))
    proof = prove_memory(inputs, start, cap, mem_floor_mb(inputs), time.perf_counter() + budget)
    assert proof.floor_mb <= optimum <= max_abs_mem_mb(inputs, proof.servers)
    assert max_abs_mem_mb(inputs, proof.servers) <= max_abs_mem_mb(inputs, start)
    assert fits(inputs, proof.servers) and _max_eq(inputs, proof.servers) <= cap


def test_place_models_reports_the_proved_bound():
    # Three 4-GPU servers; 4-shard models fill a server each, so max |mem|
    # is the largest |R| among them (35 GB) with max |eq| = 4, while the mean
    # floor is 5 GB: the proof makes the answer optimal.
    models = (
        PlacedModel("a", 35 * GB, 4),
        PlacedModel("b", -10 * GB, 4),
        PlacedModel("c", -10 * GB, 4),
    )
    inputs = PlacementInputs(models, 3, 4, 80 * GB)
    p = place_models(inputs, time_limit_s=5)
    assert p.objective_bytes == (35 + 80 * 4) * GB == p.best_bound_bytes
    assert p.status == "OPTIMAL" and p.gap == 0
    # Proved before any solve (the mean floor alone would leave 30 GB open).
    assert "meets the lower bound" in p.note
