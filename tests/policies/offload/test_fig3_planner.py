"""OrbitFlow's Fig. 3 (paper §2.3) through the planner: the exact event model
in block-times reproduces the figure's stalls for Placements A and B, and the
planner, optimising that model, picks B at Step 1 and C at Step 16.

Two requests on a 9-layer model, a 70-block GPU budget, a link that moves 3
blocks per layer of compute (one block-time = 1/3 of a layer's compute).
Request 1 has 3 blocks per layer at Step 1 and 4 at Step 16 (33 and 48
tokens of 16-token blocks, plus the token each step writes), Request 2 has 6
(80 tokens). A offloads L3, L6, L9 of both; B keeps Request 1 whole and
offloads L3, L6, L9 of Request 2; C offloads L4, L8 of Request 1 and L3, L6,
L9 of Request 2 (layers 1-indexed as in the paper).

Where the paper is not self-consistent with its own link model: it gives C
"perfect overlap" at Step 1 and 2 stalls at Step 16. Those are the numbers of
a link that serves the most urgent fetch first (the relaxed-link bound of
step_kernels.py reproduces them); with the fair sharing of DESIGN.md §3.2,
Request 1's early L4 fetch takes half the link from Request 2's urgent L3
fetch, and C stalls 6 and 7 block-times. C is still the planner's choice at
Step 16, as in the paper. docs/offload.md has the walk-through.
"""

from __future__ import annotations

import numpy as np
import pytest

from planner.domain.offload import DecodeBatch, OffloadInputs, OffloadParams
from planner.policies.offload import StepInputs, simulate_step
from planner.policies.offload.placement import plan_layer_offload
from planner.policies.offload.step_kernels import pattern_layers, relaxed_latencies

LAYERS = 9
COMP = np.ones(LAYERS)
BANDWIDTH = 3.0  # blocks per layer time
BUDGET = 70
STEP1_TOKENS = [33, 80]
STEP16_TOKENS = [48, 80]


def _resident(*offloaded: list[int]) -> np.ndarray:
    resident = np.ones((len(offloaded), LAYERS), dtype=bool)
    for r, layers in enumerate(offloaded):
        resident[r, [layer - 1 for layer in layers]] = False
    return resident


A = _resident([3, 6, 9], [3, 6, 9])
B = _resident([], [3, 6, 9])
C = _resident([4, 8], [3, 6, 9])


def _blocks(tokens: list[int]) -> list[int]:
    return [-(-(t + 1) // 16) for t in tokens]


def _stall_block_times(tokens: list[int], resident: np.ndarray) -> float:
    timeline = simulate_step(StepInputs.of(COMP, _blocks(tokens), resident, BANDWIDTH))
    return timeline.total_stall_s * BANDWIDTH


def _relaxed_stall_block_times(tokens: list[int], resident: np.ndarray) -> float:
    layers_of, count = pattern_layers(~resident)
    rows = np.arange(len(tokens))
    latency = relaxed_latencies(
        COMP,
        BANDWIDTH,
        np.array(_blocks(tokens), dtype=np.float64),
        layers_of,
        count,
        rows,
        rows[None, :],
        np.zeros(1),
    )
    return float(latency[0] - COMP.sum()) * BANDWIDTH


def _gpu_blocks(tokens: list[int], resident: np.ndarray) -> int:
    blocks = np.array(_blocks(tokens))
    fetched = (blocks[:, None] * ~resident).sum(axis=0)
    return int((blocks[:, None] * resident).sum() + fetched.max())


def _plan(tokens: list[int]):
    batch = DecodeBatch(
        ids=("request-1", "request-2"),
        num_tokens=np.array(tokens, dtype=np.int64),
        deposited_tokens=np.zeros(2, dtype=np.int64),
        slo_tbt_s=np.full(2, 100.0),
        paused=np.zeros(2, dtype=bool),
        steps_left=np.full(2, -1, dtype=np.int64),
    )
    inputs = OffloadInputs(
        layer_compute_s=COMP,
        link_blocks_per_s=BANDWIDTH,
        gpu_block_budget=BUDGET,
        block_size_tokens=16,
        params=OffloadParams(time_limit_s=30.0),
    )
    return plan_layer_offload(batch, inputs)


def test_the_requests_grow_as_in_the_figure():
    assert _blocks(STEP1_TOKENS) == [3, 6]
    assert _blocks(STEP16_TOKENS) == [4, 6]


def test_placement_a_stalls_9_then_12():
    # "those transfers spill past the preceding layer's compute and create 9
    # units of stalls"; at Step 16 "must now prefetch 10 blocks per layer,
    # causing 12 stalls in total".
    assert _stall_block_times(STEP1_TOKENS, A) == pytest.approx(9)
    assert _stall_block_times(STEP16_TOKENS, A) == pytest.approx(12)
    assert _gpu_blocks(STEP1_TOKENS, A) == 63 and _gpu_blocks(STEP16_TOKENS, A) == 70


def test_placement_b_overlaps_perfectly_then_overflows():
    assert _stall_block_times(STEP1_TOKENS, B) == 0
    assert _gpu_blocks(STEP1_TOKENS, B) == 69
    # "These additional blocks push Placement B's memory usage to 78 blocks".
    assert _gpu_blocks(STEP16_TOKENS, B) == 78


def test_placement_a_is_the_best_uniform_choice():
    # "offloading one more layer ... resulting in longer stalls; offloading
    # one less layer requires keeping too many blocks on GPU".
    denser = _resident([2, 4, 6, 8], [2, 4, 6, 8])
    assert _stall_block_times(STEP1_TOKENS, denser) > 9
    sparser = _resident([4, 8], [4, 8])
    assert _gpu_blocks(STEP1_TOKENS, sparser) > BUDGET


def test_placement_c_paper_numbers_are_those_of_an_urgent_first_link():
    # Pinned: our fair-sharing model gives C 6 and 7 block-times; the paper's
    # 0 and 2 are what the relaxed (most-urgent-first) link gives.
    assert _stall_block_times(STEP1_TOKENS, C) == pytest.approx(6)
    assert _stall_block_times(STEP16_TOKENS, C) == pytest.approx(7)
    assert _relaxed_stall_block_times(STEP1_TOKENS, C) == pytest.approx(0)
    assert _relaxed_stall_block_times(STEP16_TOKENS, C) == pytest.approx(2)
    assert _gpu_blocks(STEP16_TOKENS, C) == 70


def test_planner_chooses_b_at_step_1():
    plan = _plan(STEP1_TOKENS)
    layers = {p.id: tuple(layer + 1 for layer in p.offloaded_layers) for p in plan.placements}
    assert layers == {"request-1": (), "request-2": (3, 6, 9)}
    assert plan.predicted_step_s == pytest.approx(9.0)  # no stall
    assert plan.gpu_blocks_used == 69
    assert str(plan.solve.status) == "OPTIMAL"
    # The surrogate scores B at 1 block-time-per-layer of stall: it alone
    # would not find it.
    assert plan.predicted_step_surrogate_s == pytest.approx(12.0)


def test_planner_chooses_c_at_step_16():
    plan = _plan(STEP16_TOKENS)
    layers = {p.id: tuple(layer + 1 for layer in p.offloaded_layers) for p in plan.placements}
    assert layers == {"request-1": (4, 8), "request-2": (3, 6, 9)}
    assert (plan.predicted_step_s - 9.0) * BANDWIDTH == pytest.approx(7)
    assert plan.gpu_blocks_used == 70
    assert str(plan.solve.status) == "OPTIMAL"
