"""The layer-offload planner: exact small plans against brute force over the
pruned space, memory accounting with the prefetch buffer, the window's latency
ceiling, window choice under tight and ample margins, and Pause-Resume."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest

from planner.domain.offload import DecodeBatch, OffloadInputs, OffloadParams, PlanSource
from planner.policies.offload.greedy import greedy_choice
from planner.policies.offload.memory import gpu_blocks_needed
from planner.policies.offload.placement import plan_layer_offload, window_grid
from planner.policies.offload.search_space import candidate_patterns
from planner.policies.offload.surrogate import surrogate_latency_s
from planner.policies.offload.window import latency_ceiling_s, violations

BW = 1000.0  # blocks per second: one block-time is 1 ms


def batch(tokens, deposits=None, paused=None, slo=0.1) -> DecodeBatch:
    n = len(tokens)
    return DecodeBatch(
        ids=tuple(f"r{i}" for i in range(n)),
        num_tokens=np.array(tokens, np.int64),
        deposited_tokens=np.array(deposits or [0] * n, np.int64),
        slo_tbt_s=np.full(n, slo),
        paused=np.array(paused or [False] * n),
        steps_left=np.full(n, -1, np.int64),
    )


def inputs(layers, budget, *, comp_ms=2.0, window=(1, 1), cap=1.0, backend="cp-sat"):
    return OffloadInputs(
        layer_compute_s=np.full(layers, comp_ms / 1e3),
        link_blocks_per_s=BW,
        gpu_block_budget=budget,
        params=OffloadParams(
            violation_cap=cap,
            min_window_steps=window[0],
            max_window_steps=window[1],
            time_limit_s=10.0,
            backend=backend,
        ),
    )


def test_a_target_too_small_for_the_ratio_is_violated_every_step():
    # 1,000 s / 1e-308 s overflows to inf: every step of the window violates,
    # whatever is banked, and no floating-point warning escapes.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        counts = violations(1000.0, 4, np.array([3, 0]), np.array([1e-308, 0.1]))
    assert counts.tolist() == [4, 4]


def test_latency_ceiling_worked_examples():
    slo = np.array([0.1, 0.1])
    # Request 1 (3 tokens banked) can run 4 steps of 0.175 s dry-free;
    # request 2 has nothing banked and takes the one violation per step.
    assert latency_ceiling_s(4, np.array([3, 0]), slo, 1.0) == pytest.approx(0.175)
    assert latency_ceiling_s(4, np.array([2, 0]), slo, 1.0) == pytest.approx(0.15)
    assert violations(0.15, 4, np.array([2, 0]), slo).tolist() == [0, 4]
    assert violations(0.16, 4, np.array([2, 0]), slo).tolist() == [1, 4]
    # No more requests than the cap: any latency is allowed.
    assert math.isinf(latency_ceiling_s(8, np.array([0]), np.array([0.1]), 1.0))
    # With alpha = 0 nobody may violate: the tightest SLO is the ceiling.
    assert latency_ceiling_s(8, np.array([0, 50]), np.array([0.05, 0.1]), 0.0) == 0.05


def test_window_grid():
    assert window_grid(1, 64) == [1, 2, 4, 8, 16, 32, 64]
    assert window_grid(3, 20) == [3, 6, 12, 20]
    assert window_grid(5, 5) == [5]
    with pytest.raises(ValueError):
        window_grid(4, 2)


def brute_force(tokens, layers, budget, comp_ms, ceiling_s):
    """min surrogate latency, then fewer fetched blocks, over the pruned space
    with a one-step window."""
    cands = candidate_patterns(layers)
    blocks = -(-(np.array(tokens) + 1) // 16)
    best = None
    for combo in itertools.product(range(len(cands)), repeat=len(tokens)):
        resident = cands.resident[list(combo)]
        if gpu_blocks_needed(blocks, resident) > budget:
            continue
        latency = float(surrogate_latency_s(np.full(layers, comp_ms / 1e3), blocks, resident, BW))
        if latency > ceiling_s + 1e-12:
            continue
        fetched = int((blocks[:, None] * (~resident)).sum())
        key = (round(latency, 9), fetched)
        if best is None or key < best[0]:
            best = (key, combo)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_exact_small_plans_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(20, 200, 3).tolist()
    layers = 6
    blocks = -(-(np.array(tokens) + 1) // 16)
    budget = int(blocks.sum() * layers * rng.uniform(0.7, 0.95))
    expected = brute_force(tokens, layers, budget, 2.0, math.inf)
    plan = plan_layer_offload(batch(tokens, slo=10.0), inputs(layers, budget, window=(1, 1)))
    if expected is None:
        assert plan.newly_paused_ids
        return
    (latency, fetched), _ = expected
    assert plan.source is PlanSource.SOLVER
    assert plan.predicted_step_surrogate_s == pytest.approx(latency, abs=1e-9)
    assert sum(p.fetched_blocks_per_step for p in plan.placements) == fetched
    assert plan.gpu_blocks_used <= budget


def test_memory_counts_the_prefetch_buffer():
    # Two requests of 2 blocks per layer on 4 layers: 16 blocks. A budget of
    # 13 needs 3 offloaded blocks plus their one-layer buffer: offloading
    # one layer of one request (2 blocks out, 2 in the buffer) gives 16, too
    # much; two layers of one request give 12 + 2 = 14, too much; only the
    # largest patterns fit.
    tokens = [20, 20]
    plan = plan_layer_offload(batch(tokens, slo=10.0), inputs(4, 14, window=(1, 1)))
    assert plan.gpu_blocks_used <= 14
    assert plan.gpu_blocks_used == (
        sum(p.gpu_blocks for p in plan.placements) + plan.prefetch_buffer_blocks
    )
    assert plan.prefetch_buffer_blocks == max(
        sum(p.blocks_per_layer for p in plan.placements if layer in p.offloaded_layers)
        for layer in range(4)
    )


def test_window_is_long_with_ample_margin_and_short_with_a_tight_one():
    tokens = [300, 500]
    roomy = plan_layer_offload(batch(tokens, slo=1.0), inputs(8, 10_000, window=(1, 64)))
    assert roomy.window_steps == 64 and roomy.expiry_step == 64
    # Nothing banked, a TBT SLO just above the step, a memory budget that the
    # KV outgrows within a few steps: a short window.
    blocks_now = -(-(np.array(tokens) + 1) // 16)
    budget = int(blocks_now.sum() * 8) + 8
    tight = plan_layer_offload(
        batch(tokens, slo=0.0165), inputs(8, budget, window=(1, 64), cap=0.0), step=100
    )
    assert 1 <= tight.window_steps < 64
    assert tight.expiry_step == 100 + tight.window_steps


def test_pause_resume_pauses_the_most_blocks_plus_deposit():
    # r0 has the most KV, but r1's deposit tips the sum: r1 is the victim.
    tokens = [1600, 1500, 200]
    deposits = [0, 200, 0]
    blocks = -(-(np.array(tokens) + 1) // 16)
    layers = 4
    budget = int((blocks[0] + blocks[2]) * layers)
    plan = plan_layer_offload(
        batch(tokens, deposits, slo=0.0081),
        inputs(layers, budget, comp_ms=2.0, cap=0.0),
    )
    assert plan.newly_paused_ids == ("r1",)
    assert {p.id for p in plan.placements} == {"r0", "r2"}


def test_a_paused_request_resumes_when_a_feasible_plan_includes_it():
    plan = plan_layer_offload(batch([100, 100], paused=[False, True], slo=1.0), inputs(4, 10_000))
    assert plan.resumed_ids == ("r1",) and plan.paused_ids == ()
    stay = plan_layer_offload(batch([100, 5000], paused=[False, True], slo=1.0), inputs(4, 100))
    assert stay.resumed_ids == () and stay.paused_ids == ("r1",)


def test_greedy_offloads_the_largest_first_until_it_fits():
    cands = candidate_patterns(8)
    blocks = np.array([10, 2])
    choice = greedy_choice(blocks, cands, 80)
    assert choice is not None
    assert choice[1] == 0 and choice[0] > 0
    assert gpu_blocks_needed(blocks, cands.resident[choice]) <= 80
    assert greedy_choice(blocks, cands, 10) is None
