"""The local search's stagger moves (local_search.py): the event model's idle
time per layer, a hand-checked step whose aligned fetch chains a stagger
move breaks, and, on random batches, that stagger moves from a local optimum
of the other moves never lose it under the same work."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.policies.offload.ilp import WindowOption
from planner.policies.offload.local_search import (
    STAGGER_REQUESTS,
    TALLY,
    _stagger,
    _state,
    descend,
    evaluate_one,
    new_work,
    packed,
)
from planner.policies.offload.problem import OffloadProblem, better, offload_problem
from planner.policies.offload.search import warm_up
from planner.policies.offload.search_space import candidate_patterns
from planner.policies.offload.step_kernels import remaining_compute, step_latency, step_scratch

# Four layers of 1 s, a link of 1 block/s: the pruned patterns of 4 layers
# are nothing, {4} and {2, 4}.
NOTHING, LAST, EVEN = 0, 1, 2


def _four_layers(blocks: list[int]) -> OffloadProblem:
    b = np.array(blocks, np.int64)
    window = WindowOption(steps=1, ceiling_s=100.0, end_blocks=b)
    return offload_problem(np.ones(4), 1.0, 0, b, candidate_patterns(4), windows=[window])


def _idle(problem: OffloadProblem, choice: list[int]) -> tuple[float, list[float]]:
    p = problem
    scratch = step_scratch(p.num_requests, 4)
    latency = step_latency(
        p.comp_s, remaining_compute(p.comp_s), p.bandwidth_blocks_per_s, p.blocks_f,
        p.layers_of, p.count, np.array(choice, np.int64), math.inf, scratch,
    )  # fmt: skip
    return float(latency), [float(v) for v in scratch[7][:4]]


def test_the_idle_time_of_one_request_offloading_every_second_layer():
    # Its fetch of layer 2 (2 blocks, released at 0) ends at 2: layer 2 runs
    # 2-3 with the link idle (layer 4's fetch is released when layer 2 ends),
    # that fetch runs 3-5 under layer 3, layer 4 runs 5-6.
    latency, idle = _idle(_four_layers([2]), [EVEN])
    assert latency == 6.0
    assert idle == [0.0, 1.0, 0.0, 0.0]


def test_a_stagger_move_breaks_two_aligned_fetch_chains():
    warm_up()
    free = _four_layers([1, 1])
    aligned = np.array([EVEN, EVEN], np.int64)
    staggered = np.array([LAST, EVEN], np.int64)
    # Aligned: both fetches of layer 2 share the link (done at 2), the link
    # idles through layer 2 (2-3), both fetches of layer 4 run 3-5: 6 s.
    # Request 0 offloading layer 4 only: its fetch runs from 0 beside
    # request 1's of layer 2 (both done at 2), request 1's of layer 4 runs
    # 3-4: 5 s.
    assert _idle(free, [EVEN, EVEN]) == (6.0, [0.0, 1.0, 0.0, 0.0])
    assert _idle(free, [LAST, EVEN])[0] == 5.0
    # The memory that the staggered plan needs: request 0 offloading nothing
    # needs the same (one more layer resident, one block less of buffer).
    rows = np.arange(2)
    used = int(free.mem_coef[0, rows, staggered].sum() + free.evaluate(staggered).buffer[0])
    problem = replace(free, mem_cap=free.mem_cap - free.mem_cap[0] + used)
    kernel = packed(problem)
    choice = aligned.copy()
    layer_blocks, mem = _state(kernel, choice)
    tally = np.zeros(len(TALLY), np.int64)
    none = np.zeros(0, np.int64)
    moved = _stagger(
        kernel, choice, layer_blocks, mem, *evaluate_one(kernel, aligned), STAGGER_REQUESTS,
        none, none, np.zeros(0), aligned.copy(), new_work(1 << 20), math.inf,
        step_scratch(2, 4), tally,
    )  # fmt: skip
    # Request 0 (the first of the two that hold the link back alike) tries
    # its patterns in order; the first, nothing, improves: request 1's fetch
    # of layer 2 runs 0-1, its fetch of layer 4 2-3, no stall: 4 s.
    assert moved
    assert choice.tolist() == [NOTHING, EVEN]
    assert evaluate_one(kernel, choice)[0] == 4.0
    assert tally[TALLY.index("stagger_moves")] == 1


def _problem(tokens: list[int], fill: float, layers: int) -> OffloadProblem:
    blocks = np.array([-(-(t + 1) // 16) for t in tokens], np.int64)
    window = WindowOption(steps=1, ceiling_s=10.0, end_blocks=blocks)
    free = offload_problem(
        np.linspace(0.001, 0.003, layers), 2000.0, 0, blocks, candidate_patterns(layers),
        windows=[window],
    )  # fmt: skip
    return replace(free, mem_cap=free.mem_cap + max(int(blocks.sum() * layers * fill), 1))


problems = st.builds(
    _problem,
    st.lists(st.integers(200, 4000), min_size=2, max_size=5),
    st.floats(0.3, 0.9),
    st.integers(6, 24),
)


@settings(max_examples=40, deadline=None)
@given(problems, st.integers(1, 400))
def test_stagger_moves_never_lose_the_local_optimum_under_the_same_work(problem, work):
    """From the plan the other moves converge to, descend with stagger moves
    returns one at least as good within the same remaining work, and it is
    still a local optimum of the other moves when it converges."""
    warm_up()
    kernel = packed(problem)
    start = np.full(problem.num_requests, problem.num_choices - 1, np.int64)
    objective = evaluate_one(kernel, start)
    if not math.isfinite(objective[0]):
        return
    tally = np.zeros(len(TALLY), np.int64)
    plain = start.copy()
    before = descend(kernel, plain, *objective, new_work(1 << 40), math.inf, tally, 0)
    staggered = plain.copy()
    after = descend(kernel, staggered, *before[:2], new_work(work), math.inf, tally, 2)
    assert after[:2] == evaluate_one(kernel, staggered)
    assert not better(*before[:2], *after[:2])
    if after[2]:
        again = staggered.copy()
        assert (
            descend(kernel, again, *after[:2], new_work(1 << 40), math.inf, tally, 0)[:2]
            == (after[:2])
        )
