"""The greedy placement: OrbitFlow's "Dynamic Heuristic" baseline (§4.1:
minimise offloaded layers, re-planned every step), and the planner's safe
fallback when the solver finds no solution in time.

Start with nothing offloaded; while the batch does not fit in the GPU block
budget, move the request holding the most resident blocks to its next
candidate pattern (one with more layers offloaded). None when even every
request at its largest pattern does not fit.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from planner.policies.offload.memory import gpu_blocks_needed
from planner.policies.offload.search_space import OffloadCandidates

IntArray = npt.NDArray[np.int64]


def greedy_choice(
    end_blocks: IntArray,
    candidates: OffloadCandidates,
    gpu_block_budget: int,
) -> IntArray | None:
    """One candidate index per request (candidates are ordered by offloaded
    count, index 0 offloading nothing); end_blocks are the blocks per layer
    the check uses (the window's end)."""
    num_requests = end_blocks.shape[0]
    num_layers = candidates.offloaded.shape[1]
    last = len(candidates) - 1
    choice = np.zeros(num_requests, dtype=np.int64)
    resident = candidates.resident
    while gpu_blocks_needed(end_blocks, resident[choice]) > gpu_block_budget:
        movable = choice < last
        if not movable.any():
            return None
        kept = end_blocks * (num_layers - candidates.count[choice])
        r = int(np.argmax(np.where(movable, kept, -1)))
        choice[r] += 1
    return choice
