"""The compiled local search (local_search.py) on random small batches: the
step simulation's early stop never changes a latency it returns, descend
ends at a local optimum of the narrow single moves with the objective
problem.evaluate gives, the kicks never lose the best plan and repeat on the
same work, and fill reaches the memory row when it can be reached."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.bench.solvers_offload_instances import make_instance
from planner.domain.offload import DecodeBatch, OffloadInputs, OffloadParams
from planner.policies.offload.local_search import (
    NARROW_STEPS,
    STAGGER_REQUESTS,
    TALLY,
    descend,
    fill_from_nothing,
    improve,
    new_work,
    packed,
)
from planner.policies.offload.placement import end_blocks, window_options
from planner.policies.offload.problem import OffloadProblem, better, offload_problem
from planner.policies.offload.search import branch_and_bound, stall_greedy, warm_up
from planner.policies.offload.search_space import candidate_patterns
from planner.policies.offload.step_kernels import (
    exact_latencies,
    remaining_compute,
    step_latency,
    step_scratch,
)

NO_DEADLINE = math.inf


def _problem(tokens: list[int], fill: float, layers: int, slo_s: float) -> OffloadProblem:
    n = len(tokens)
    batch = DecodeBatch(
        ids=tuple(f"r{i}" for i in range(n)),
        num_tokens=np.array(tokens, np.int64),
        deposited_tokens=np.zeros(n, np.int64),
        slo_tbt_s=np.full(n, slo_s),
        paused=np.zeros(n, bool),
        steps_left=np.full(n, -1, np.int64),
    )
    whole = sum(-(-(t + 1) // 16) for t in tokens) * layers
    inputs = OffloadInputs(
        layer_compute_s=np.linspace(0.001, 0.003, layers),
        link_blocks_per_s=2000.0,
        gpu_block_budget=max(int(whole * fill), 1),
        params=OffloadParams(max_window_steps=8),
    )
    return offload_problem(
        inputs.layer_compute_s,
        inputs.link_blocks_per_s,
        inputs.gpu_block_budget,
        end_blocks(batch, 0, inputs.block_size_tokens),
        candidate_patterns(layers),
        windows=window_options(batch, inputs),
    )


problems = st.builds(
    _problem,
    st.lists(st.integers(16, 1600), min_size=1, max_size=6),
    st.floats(0.3, 1.1),
    st.sampled_from([6, 8, 12, 16]),
    st.sampled_from([0.03, 0.08, 1.0]),
)


def _objective(problem: OffloadProblem, choice: np.ndarray) -> tuple[float, float]:
    ev = problem.evaluate(choice)
    return float(ev.objective[0]), float(ev.tiebreak[0])


def _feasible_start(problem: OffloadProblem) -> np.ndarray | None:
    every = [stall_greedy(problem)]
    every += [np.full(problem.num_requests, c, np.int64) for c in range(problem.num_choices)]
    ev = problem.evaluate(np.stack(every))
    i = ev.best()
    return every[i].copy() if math.isfinite(float(ev.objective[i])) else None


@settings(max_examples=80, deadline=None)
@given(problems, st.floats(0.5, 1.5))
def test_the_early_stop_never_changes_a_latency(problem, fraction):
    rng = np.random.default_rng(len(problem.blocks))
    choices = rng.integers(0, problem.num_choices, (8, problem.num_requests))
    exact = exact_latencies(
        problem.comp_s, problem.bandwidth_blocks_per_s, problem.blocks_f,
        problem.layers_of, problem.count, choices,
    )  # fmt: skip
    scratch = step_scratch(problem.num_requests, len(problem.comp_s))
    remaining = remaining_compute(problem.comp_s)
    for row, full in zip(choices, exact, strict=True):
        limit = float(full) * fraction
        stopped = step_latency(
            problem.comp_s, remaining, problem.bandwidth_blocks_per_s, problem.blocks_f,
            problem.layers_of, problem.count, row, limit, scratch,
        )  # fmt: skip
        if full <= limit:
            assert stopped == full
        else:
            assert stopped == full or math.isinf(stopped)


@settings(max_examples=60, deadline=None)
@given(problems, st.sampled_from([0, STAGGER_REQUESTS]))
def test_descend_ends_at_a_local_optimum_of_the_narrow_single_moves(problem, stagger):
    start = _feasible_start(problem)
    if start is None:
        return
    kernel = packed(problem)
    choice = start.copy()
    before = _objective(problem, start)
    tally = np.zeros(len(TALLY), np.int64)
    latency, tiebreak, converged = descend(
        kernel, choice, *before, new_work(1 << 40), NO_DEADLINE, tally, stagger
    )
    assert converged
    # Its objective is the exact one, and it is no worse than the start.
    assert (latency, tiebreak) == _objective(problem, choice)
    assert not better(*before, latency, tiebreak)
    # No single narrow move improves it.
    for r in range(problem.num_requests):
        for c in range(problem.num_choices):
            if c == choice[r] or not (c == 0 or abs(c - choice[r]) <= NARROW_STEPS):
                continue
            moved = choice.copy()
            moved[r] = c
            assert not better(*_objective(problem, moved), latency, tiebreak)


@settings(max_examples=40, deadline=None)
@given(problems, st.integers(0, 20), st.booleans())
def test_kicks_keep_the_best_plan_and_repeat_on_the_same_work(problem, kicks, spread_kicks):
    start = _feasible_start(problem)
    if start is None:
        return
    kernel = packed(problem)
    plain = start.copy()
    tally = np.zeros(len(TALLY), np.int64)
    descended = descend(kernel, plain, *_objective(problem, start), new_work(1 << 40),
                        NO_DEADLINE, tally, 0)  # fmt: skip
    runs = []
    for _ in range(2):
        choice = start.copy()
        tally = np.zeros(len(TALLY), np.int64)
        latency, tiebreak, _ = improve(
            kernel, new_work(5000), NO_DEADLINE, choice, kicks, tally, 0, False, spread_kicks
        )
        assert (latency, tiebreak) == _objective(problem, choice)
        assert tally[TALLY.index("kicks")] <= kicks
        runs.append((choice, latency, tiebreak))
    assert not better(descended[0], descended[1], runs[0][1], runs[0][2])
    assert (runs[0][0] == runs[1][0]).all() and runs[0][1:] == runs[1][1:]


@settings(max_examples=60, deadline=None)
@given(problems)
def test_fill_reaches_the_memory_row_when_the_largest_patterns_do(problem):
    largest = np.full(problem.num_requests, problem.num_choices - 1, np.int64)
    rows = np.arange(problem.num_requests)

    def memory_holds(choice: np.ndarray) -> bool:
        used = problem.mem_coef[0, rows, choice].sum() + problem.evaluate(choice).buffer[0]
        return bool(used <= problem.mem_cap[0])

    filled = fill_from_nothing(packed(problem), new_work(1 << 40), NO_DEADLINE)
    assert not memory_holds(largest) or memory_holds(filled)


def _large() -> OffloadProblem:
    """A 24 x 32 batch of the solver bench's moderate class (memory binds)."""
    return make_instance(24, 32, 1, 0).problem


def test_a_large_batch_is_searched_by_kicks_and_reports_its_moves():
    problem = _large()
    result = branch_and_bound(problem, time_limit_s=60.0, node_limit=3000)
    assert result.status is not None and result.has_solution
    assert result.moves["rounds"] > 0 and result.moves["kicks"] > 0
    # Without the tree, the bound is the root's: below the plan, a gap stated.
    assert result.best_bound is not None and result.best_bound <= result.objective
    again = branch_and_bound(problem, time_limit_s=60.0, node_limit=3000)
    assert (again.choice == result.choice).all() and again.moves == result.moves


def test_warm_up_runs():
    warm_up()


@pytest.mark.parametrize("budget", [1, 50, 400])
def test_the_node_limit_stops_the_local_search(budget):
    problem = _large()
    result = branch_and_bound(problem, time_limit_s=60.0, node_limit=budget)
    # The starts are scored together (one node each); then it stops within
    # one simulation of the limit.
    starts = problem.num_choices + 2
    assert result.nodes <= max(budget, starts) + 1
