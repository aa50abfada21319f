"""The offload problem and its search: the search's objective is the exact
event model and its plan equals exhaustive enumeration on the exact model
(the optimum over the pruned space) on random small batches, infeasible ones
included; the surrogate ILP's closed form equals CP-SAT's objective on it;
limits, the gap and the backends."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ortools.sat.python import cp_model
from planner.solvers import Backend, Status, solve

from planner.domain.offload import DecodeBatch, OffloadInputs, OffloadParams, PlanSource
from planner.policies.offload.event_model import step_latency_s
from planner.policies.offload.greedy import greedy_choice
from planner.policies.offload.ilp import build_offload_ilp
from planner.policies.offload.placement import end_blocks, plan_layer_offload, window_options
from planner.policies.offload.problem import OffloadProblem, offload_problem
from planner.policies.offload.search import _Nodes, branch_and_bound, stall_greedy
from planner.policies.offload.search_space import candidate_patterns
from planner.policies.offload.step import StepInputs


def make_batch(tokens: list[int], deposits: list[int], slo_s: float) -> DecodeBatch:
    n = len(tokens)
    return DecodeBatch(
        ids=tuple(f"r{i}" for i in range(n)),
        num_tokens=np.array(tokens, np.int64),
        deposited_tokens=np.array(deposits, np.int64),
        slo_tbt_s=np.full(n, slo_s),
        paused=np.zeros(n, bool),
        steps_left=np.full(n, -1, np.int64),
    )


def make_inputs(
    layers: int, budget: int, *, backend: Backend = Backend.BRANCH_AND_BOUND, **params
) -> OffloadInputs:
    return OffloadInputs(
        layer_compute_s=np.linspace(0.001, 0.003, layers),
        link_blocks_per_s=2000.0,
        gpu_block_budget=budget,
        params=OffloadParams(time_limit_s=10.0, backend=backend, **params),
    )


def problem_of(batch: DecodeBatch, inputs: OffloadInputs) -> tuple[OffloadProblem, list]:
    candidates = candidate_patterns(inputs.num_layers, inputs.params.search_mode)
    windows = window_options(batch, inputs)
    blocks = end_blocks(batch, 0, inputs.block_size_tokens)
    args = (inputs.layer_compute_s, inputs.link_blocks_per_s, inputs.gpu_block_budget)
    problem = offload_problem(*args, blocks, candidates, windows=windows)
    ilp = build_offload_ilp(*args, blocks, candidates, windows=windows)
    return problem, [ilp, candidates, windows]


batches = st.builds(
    lambda tokens, deposits, slo, layers, fill: (tokens, deposits, slo, layers, fill),
    st.lists(st.integers(16, 1600), min_size=1, max_size=4),
    st.lists(st.integers(0, 4), min_size=4, max_size=4),
    st.sampled_from([0.02, 0.05, 0.2]),
    st.sampled_from([6, 8, 12]),
    st.floats(0.3, 1.3),
)


@settings(max_examples=60, deadline=None)
@given(batches)
def test_branch_and_bound_equals_enumeration_on_the_exact_model(case):
    tokens, deposits, slo, layers, fill = case
    batch = make_batch(tokens, deposits[: len(tokens)], slo)
    blocks = sum(-(-t // 16) for t in tokens) * layers
    inputs = make_inputs(layers, max(int(blocks * fill), 1), max_window_steps=8)
    problem, _ = problem_of(batch, inputs)
    found = problem.enumerate()
    choice, best, tie = found.choice, found.latency, found.tiebreak
    result = branch_and_bound(problem, time_limit_s=30.0)
    if choice is None:
        assert result.status is Status.INFEASIBLE and result.choice is None
        return
    assert result.status is Status.OPTIMAL
    assert result.objective == pytest.approx(best, rel=1e-12)
    # Latency ties are broken among the plans the search visits: a proof that
    # the latency is optimal ends it, so its tiebreak is never better than
    # enumeration's, the least over every latency-optimal plan.
    assert result.tiebreak >= tie
    ev = problem.evaluate(result.choice)
    # The objective is the exact event model's step latency of the plan.
    resident = candidate_patterns(layers).resident[result.choice]
    exact = step_latency_s(StepInputs.of(problem.comp_s, problem.blocks, resident, 2000.0))
    assert float(ev.objective[0]) == pytest.approx(exact, rel=1e-12)
    assert result.best_bound == pytest.approx(best, rel=1e-12) and result.gap == 0.0


@pytest.mark.parametrize("seed", range(6))
def test_surrogate_closed_form_equals_cp_sat_on_the_ilp(seed):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(100, 2000, 3).tolist()
    batch = make_batch(tokens, rng.integers(0, 3, 3).tolist(), 0.05)
    total = sum(-(-t // 16) for t in tokens) * 8
    inputs = make_inputs(8, int(total * 0.8), max_window_steps=16)
    problem, (ilp, _, _) = problem_of(batch, inputs)
    radix = problem.num_choices ** np.arange(problem.num_requests - 1, -1, -1)
    codes = np.arange(problem.enumeration_size())
    every = (codes[:, None] // radix[None, :]) % problem.num_choices
    best = float(problem.evaluate_surrogate(every).objective.min())
    result = solve(ilp.model, time_limit_s=30.0, backend=Backend.CPSAT)
    if math.isinf(best):
        assert result.status is Status.INFEASIBLE
        return
    assert result.status is Status.OPTIMAL
    assert result.objective == pytest.approx(best, abs=0.5)
    choice = np.argmax(result.value(ilp.choice), axis=1)
    assert float(problem.evaluate_surrogate(choice).objective[0]) == pytest.approx(best, abs=0.5)


def test_closed_form_worked_example():
    # 2 layers, one request of 10 blocks per layer at the next step (159
    # tokens and the one it is about to add), the second layer hides 4 blocks
    # (2 ms of compute at 2000 blocks/s): offloading layer 2 stalls 6
    # block-times and fetches 10 blocks.
    batch = make_batch([159], [0], 1.0)
    inputs = OffloadInputs(
        layer_compute_s=np.array([0.002, 0.002]),
        link_blocks_per_s=2000.0,
        gpu_block_budget=100,
        params=OffloadParams(min_window_steps=1, max_window_steps=1),
    )
    problem, _ = problem_of(batch, inputs)
    assert problem.hidden.tolist() == [0, 4]
    kept, offloaded = problem.evaluate_surrogate(np.array([[0], [1]])).stall.tolist()
    assert (kept, offloaded) == (0, 6)
    # The exact model: the fetch of layer 2 starts at 0 and overlaps layer
    # 1's compute: 10 blocks take 5 ms, layer 2 starts at 5 ms, ends at 7.
    ev = problem.evaluate(np.array([[0], [1]]))
    assert ev.latency_s.tolist() == pytest.approx([0.004, 0.007])
    assert ev.fetched.tolist() == [0, 10]
    assert ev.buffer.tolist() == [0, 10]


def hard_batch() -> tuple[DecodeBatch, OffloadInputs]:
    rng = np.random.default_rng(7)
    tokens = rng.integers(8_000, 64_000, 16)
    batch = DecodeBatch(
        ids=tuple(f"r{i}" for i in range(16)),
        num_tokens=tokens.astype(np.int64),
        deposited_tokens=rng.integers(0, 3, 16).astype(np.int64),
        slo_tbt_s=np.full(16, 0.2),
        paused=np.zeros(16, bool),
        steps_left=rng.integers(10, 500, 16).astype(np.int64),
    )
    blocks = int((-(-tokens // 16)).sum()) * 32
    inputs = OffloadInputs(
        layer_compute_s=np.full(32, 0.0004),
        link_blocks_per_s=381_000.0,
        gpu_block_budget=int(blocks / 1.05),
        params=OffloadParams(time_limit_s=0.5),
    )
    return batch, inputs


def test_time_limit_returns_the_incumbent_with_its_bound():
    batch, inputs = hard_batch()
    problem, _ = problem_of(batch, inputs)
    start = stall_greedy(problem)
    result = branch_and_bound(problem, time_limit_s=1e-6, starts=[start])
    assert result.status is Status.FEASIBLE
    assert result.best_bound is not None and result.best_bound < result.objective
    assert result.objective <= float(problem.evaluate(start).objective[0])
    assert 0 < result.gap < 1


def test_node_limit_gives_the_same_plan_on_any_machine():
    batch, inputs = hard_batch()
    problem, _ = problem_of(batch, inputs)
    first = branch_and_bound(problem, time_limit_s=60.0, node_limit=3000)
    again = branch_and_bound(problem, time_limit_s=60.0, node_limit=3000)
    assert first.status is Status.FEASIBLE
    assert first.nodes == again.nodes and 3000 <= first.nodes < 3000 + problem.num_choices * 2
    assert (first.choice == again.choice).all() and first.objective == again.objective
    assert first.best_bound == again.best_bound
    more = branch_and_bound(problem, time_limit_s=60.0, node_limit=20_000)
    assert more.objective <= first.objective


def test_relative_gap_stops_within_the_gap():
    batch, inputs = hard_batch()
    problem, (_, candidates, windows) = problem_of(batch, inputs)
    greedy = greedy_choice(windows[0].end_blocks, candidates, inputs.gpu_block_budget)
    result = branch_and_bound(problem, time_limit_s=60.0, relative_gap=0.2, starts=[greedy])
    assert result.status in {Status.OPTIMAL, Status.FEASIBLE}
    assert result.gap is not None and result.gap <= 0.2 + 1e-9


def test_plan_reports_the_branch_and_bound():
    batch, inputs = hard_batch()
    plan = plan_layer_offload(batch, inputs)
    assert plan.source is PlanSource.SOLVER
    assert plan.solve is not None and plan.solve.backend is Backend.BRANCH_AND_BOUND
    assert plan.solve.status in {Status.OPTIMAL, Status.FEASIBLE}
    assert plan.solve.best_bound <= plan.solve.objective
    # The objective is the plan's exact step latency.
    assert plan.solve.objective == pytest.approx(plan.predicted_step_s, rel=1e-12)
    assert plan.solve.nodes > 0 and plan.solve.node_limit is None


def test_exhaustive_backend_refuses_a_large_batch():
    batch, inputs = hard_batch()
    params = OffloadParams(backend=Backend.EXHAUSTIVE)
    big = OffloadInputs(
        inputs.layer_compute_s, inputs.link_blocks_per_s, inputs.gpu_block_budget, params=params
    )
    with pytest.raises(ValueError, match="exhaustive search would try"):
        plan_layer_offload(batch, big)


@pytest.mark.parametrize("backend", [Backend.BRANCH_AND_BOUND, Backend.EXHAUSTIVE])
def test_exact_backends_agree_on_a_small_batch(backend):
    batch = make_batch([900, 300, 1200], [0, 2, 0], 0.2)
    inputs = make_inputs(8, 1000, backend=backend, max_window_steps=16)
    plan = plan_layer_offload(batch, inputs)
    reference = plan_layer_offload(
        batch, make_inputs(8, 1000, backend=Backend.EXHAUSTIVE, max_window_steps=16)
    )
    assert not plan.paused_ids and any(p.offloaded_layers for p in plan.placements)
    assert plan.solve.status is Status.OPTIMAL and plan.solve.backend is backend
    assert plan.solve.objective == pytest.approx(reference.solve.objective, rel=1e-12)
    assert plan.window_steps == reference.window_steps


def test_the_surrogate_ilp_plan_is_scored_on_the_exact_model():
    batch = make_batch([900, 300, 1200], [0, 2, 0], 0.2)
    plan = plan_layer_offload(batch, make_inputs(8, 1000, backend=Backend.CPSAT))
    exact = plan_layer_offload(batch, make_inputs(8, 1000, backend=Backend.EXHAUSTIVE))
    assert plan.solve.backend is Backend.CPSAT and plan.solve.best_bound is None
    assert plan.solve.objective == pytest.approx(plan.predicted_step_s, rel=1e-12)
    assert plan.solve.objective >= exact.solve.objective * (1 - 1e-12)


def test_enumeration_stops_when_asked_with_the_best_so_far():
    batch = make_batch([900, 300, 1200], [0, 2, 0], 0.2)
    problem, _ = problem_of(batch, make_inputs(8, 1000, max_window_steps=16))
    whole = problem.enumerate(chunk=4)
    assert whole.complete and whole.tried == problem.enumeration_size()
    asked = []

    def stop_after_two_chunks() -> bool:
        asked.append(True)
        return len(asked) >= 2

    part = problem.enumerate(chunk=4, stop=stop_after_two_chunks)
    assert not part.complete and part.tried == 8
    first_eight = problem.enumerate(chunk=8, stop=lambda: True)
    assert first_eight.tried == 8
    assert part.latency == first_eight.latency and part.latency >= whole.latency


def test_ilp_backends_take_a_work_limit(monkeypatch):
    seen = []
    original = cp_model.CpSolver.solve

    def spy(self, model, *args, **kwargs):
        seen.append(self.parameters.max_deterministic_time)
        return original(self, model, *args, **kwargs)

    monkeypatch.setattr(cp_model.CpSolver, "solve", spy)
    batch = make_batch([900, 300, 1200], [0, 2, 0], 0.2)
    plan = plan_layer_offload(
        batch, make_inputs(8, 1000, backend=Backend.CPSAT, ilp_work_limit=5.0)
    )
    assert plan.solve.backend is Backend.CPSAT and plan.solve.status is Status.OPTIMAL
    assert seen == [5.0]
    with pytest.raises(ValueError, match="ilp_work_limit"):
        OffloadParams(ilp_work_limit=0.0)


def test_backend_names_are_typed():
    assert OffloadParams(backend="cp-sat").backend is Backend.CPSAT
    assert OffloadParams(backend="bnb").backend is Backend.BRANCH_AND_BOUND
    with pytest.raises(ValueError, match="unknown offload backend 'simplex'"):
        OffloadParams(backend="simplex")
    with pytest.raises(ValueError, match="node_limit"):
        OffloadParams(node_limit=0)


@settings(max_examples=60, deadline=None)
@given(batches, st.floats(0.9, 1.5))
def test_leaf_scores_are_exact_below_the_cutoff(case, cutoff_scale):
    """The tree's leaves: the objective and tiebreak problem.evaluate gives
    for every row that can beat the cutoff; +inf only for rows that are
    infeasible or end past the cutoff."""
    tokens, deposits, slo, layers, fill = case
    batch = make_batch(tokens, deposits[: len(tokens)], slo)
    blocks = sum(-(-t // 16) for t in tokens) * layers
    inputs = make_inputs(layers, max(int(blocks * fill), 1), max_window_steps=8)
    problem, _ = problem_of(batch, inputs)
    rng = np.random.default_rng(len(tokens) * 1000 + layers)
    choices = rng.integers(0, problem.num_choices, (200, problem.num_requests))
    optimum = problem.enumerate()
    cutoff = math.inf
    if optimum.choice is not None:  # the optimum sits on a memory or SLO row's edge
        choices = np.vstack((choices, optimum.choice))
        cutoff = float(optimum.latency) * cutoff_scale
    ev = problem.evaluate(choices)
    nodes = _Nodes(problem)
    for row, expected, tie in zip(choices, ev.objective, ev.tiebreak, strict=True):
        in_order = row[nodes.order]  # the tree places requests in its own order
        children = nodes.expand(in_order[:-1], cutoff)
        got = float(children.bound[in_order[-1]])
        if expected <= cutoff:
            assert got == pytest.approx(expected, rel=1e-12)
            assert float(children.tiebreak[in_order[-1]]) == tie
        else:
            assert got > cutoff


@settings(max_examples=40, deadline=None)
@given(batches, st.integers(0, 3))
def test_node_bounds_never_exceed_a_completion(case, depth_seed):
    """A child's bound (node_bounds.py) is at most the exact objective of
    every completion below it, and +inf only when none is feasible."""
    tokens, deposits, slo, layers, fill = case
    batch = make_batch(tokens, deposits[: len(tokens)], slo)
    blocks = sum(-(-t // 16) for t in tokens) * layers
    inputs = make_inputs(layers, max(int(blocks * fill), 1), max_window_steps=8)
    problem, _ = problem_of(batch, inputs)
    if problem.num_requests < 2:
        return
    nodes = _Nodes(problem)
    depth = depth_seed % (problem.num_requests - 1)  # children are internal nodes
    rng = np.random.default_rng(depth_seed * 7919 + layers)
    partial = rng.integers(0, problem.num_choices, depth)
    children = nodes.expand(partial)
    rest = problem.num_requests - depth - 1
    tails = np.array(list(itertools.product(range(problem.num_choices), repeat=rest)), np.int64)
    tails = tails.reshape(len(tails), rest)
    for c in range(problem.num_choices):
        in_order = np.hstack((np.tile(np.append(partial, c), (len(tails), 1)), tails))
        full = np.empty_like(in_order)
        full[:, nodes.order] = in_order
        ev = problem.evaluate(full)
        best = float(ev.objective.min())
        bound = float(children.bound[c])
        if math.isinf(bound):
            assert math.isinf(best)
        else:
            assert bound <= best * (1 + 1e-12)
