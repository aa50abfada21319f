"""The linear latency surrogate the ILP optimizes (DESIGN.md §3.2): per layer
stall_l >= sum_r (1 - x_rl) b_r / B - comp_(l-1), stall_l >= 0, and latency =
sum_l comp_l + sum_l stall_l, with comp_(-1) = 0 before the first layer.

At the optimum each stall sits on its bound, so these functions return that
value. They broadcast over leading axes of `resident` (..., R, L), so a whole
stack of candidate placements is scored in one call.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from planner.policies.offload.step import (
    BoolArray,
    FloatArray,
    StepInputs,
    StepTimeline,
    timeline_from_stalls,
)


def surrogate_stalls_s(
    comp_s: npt.ArrayLike,
    kv_blocks: npt.ArrayLike,
    resident: npt.ArrayLike,
    bandwidth_blocks_per_s: float,
) -> FloatArray:
    """(..., L) stall of every layer under the surrogate."""
    comp = np.asarray(comp_s, dtype=np.float64)
    blocks = np.asarray(kv_blocks, dtype=np.float64)
    offloaded: BoolArray = ~np.asarray(resident, dtype=np.bool_)
    fetched = np.einsum("r,...rl->...l", blocks, offloaded)
    comp_prev = np.concatenate(([0.0], comp[:-1]))
    stalls: FloatArray = np.maximum(fetched / bandwidth_blocks_per_s - comp_prev, 0.0)
    return stalls


def surrogate_latency_s(
    comp_s: npt.ArrayLike,
    kv_blocks: npt.ArrayLike,
    resident: npt.ArrayLike,
    bandwidth_blocks_per_s: float,
) -> FloatArray:
    """(...) surrogate step latency: sum comp + sum stall (a 0-d array for
    one placement)."""
    comp = np.asarray(comp_s, dtype=np.float64)
    stalls = surrogate_stalls_s(comp, kv_blocks, resident, bandwidth_blocks_per_s)
    latency: FloatArray = comp.sum() + stalls.sum(axis=-1)
    return latency


def surrogate_timeline(inputs: StepInputs) -> StepTimeline:
    """The surrogate's stalls laid out as a timeline (fetches are not timed)."""
    stalls = surrogate_stalls_s(
        inputs.comp_s, inputs.kv_blocks, inputs.resident, inputs.bandwidth_blocks_per_s
    )
    return timeline_from_stalls(inputs.comp_s, stalls, inputs.num_requests)
