"""GPU blocks of a placement (OrbitFlow Eq. 1) on the Fig. 3 numbers, and the
real prefetch-buffer peak of an exact timeline."""

from __future__ import annotations

import numpy as np

from planner.policies.offload import (
    StepInputs,
    gpu_blocks_needed,
    peak_buffer_blocks,
    prefetch_buffer_blocks,
    simulate_step,
)

from .test_latency import (
    FIG3_BANDWIDTH,
    FIG3_COMP,
    FIG3_LAYERS,
    PLACEMENT_A,
    PLACEMENT_B,
    PLACEMENT_C,
    STEP1_BLOCKS,
    STEP16_BLOCKS,
    _resident,
)

GPU_BLOCKS = 70


def test_fig3_memory() -> None:
    # Step 1: A keeps 6 layers of 3 + 6 blocks and a 9-block buffer: 63.
    assert gpu_blocks_needed(STEP1_BLOCKS, PLACEMENT_A) == 63
    # "offloading one less layer requires keeping too many blocks on GPU,
    # violating the 70-block memory limit": distance 4 keeps 7 layers, 72.
    fewer = _resident(FIG3_LAYERS, [4, 8], [4, 8])
    assert gpu_blocks_needed(STEP1_BLOCKS, fewer) == 72 > GPU_BLOCKS
    assert gpu_blocks_needed(STEP1_BLOCKS, PLACEMENT_B) == 69
    # Step 16: "push Placement B's memory usage to 78 blocks - beyond the
    # 70-block GPU memory capacity"; A "remains feasible"; C "still fits".
    assert gpu_blocks_needed(STEP16_BLOCKS, PLACEMENT_B) == 78
    assert gpu_blocks_needed(STEP16_BLOCKS, PLACEMENT_A) == 70
    assert gpu_blocks_needed(STEP16_BLOCKS, PLACEMENT_C) == 70
    assert prefetch_buffer_blocks(STEP16_BLOCKS, PLACEMENT_C) == 6


def test_stack_of_placements() -> None:
    stack = np.stack([PLACEMENT_A, PLACEMENT_B, PLACEMENT_C])
    assert gpu_blocks_needed(STEP16_BLOCKS, stack).tolist() == [70, 78, 70]
    assert prefetch_buffer_blocks(STEP16_BLOCKS, stack).tolist() == [10, 6, 6]


def test_exact_model_can_hold_more_than_one_layer_of_fetches() -> None:
    # In C the exact model fetches Request 1's layer 4 while Request 2's layer
    # 3 is in flight: 4 + 6 = 10 blocks held at once at Step 16, more than
    # Eq. 1's one-layer buffer of 6 (so 74 > 70 blocks really in use).
    timeline = simulate_step(StepInputs.of(FIG3_COMP, STEP16_BLOCKS, PLACEMENT_C, FIG3_BANDWIDTH))
    assert peak_buffer_blocks(timeline, STEP16_BLOCKS) == 10
    # A fetches one layer at a time: the peak is Eq. 1's buffer.
    timeline = simulate_step(StepInputs.of(FIG3_COMP, STEP16_BLOCKS, PLACEMENT_A, FIG3_BANDWIDTH))
    assert peak_buffer_blocks(timeline, STEP16_BLOCKS) == 10


def test_nothing_offloaded() -> None:
    resident = np.ones((2, 3), dtype=np.bool_)
    assert gpu_blocks_needed([2, 5], resident) == 21
    timeline = simulate_step(StepInputs.of([1, 1, 1], [2, 5], resident, 1.0))
    assert peak_buffer_blocks(timeline, [2, 5]) == 0.0
    assert prefetch_buffer_blocks([2], np.ones((1, 0), dtype=np.bool_)) == 0
