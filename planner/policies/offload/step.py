"""One decode step's inputs and the timeline a latency model predicts for it
(DESIGN.md §3.2, OrbitFlow §3.3.1).

Layers are 0-indexed here; the paper and DESIGN count them from 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class StepInputs:
    """What a decode step's latency depends on.

    comp_s: (L,) compute time of each layer for the whole batch.
    kv_blocks: (R,) KV blocks of each request in every layer (b_r).
    resident: (R, L) True where request r keeps layer l on GPU (x = 1),
        False where it is fetched from CPU just in time (x = 0).
    bandwidth_blocks_per_s: CPU-to-GPU link bandwidth B.
    """

    comp_s: FloatArray
    kv_blocks: FloatArray
    resident: BoolArray
    bandwidth_blocks_per_s: float

    @classmethod
    def of(
        cls,
        comp_s: npt.ArrayLike,
        kv_blocks: npt.ArrayLike,
        resident: npt.ArrayLike,
        bandwidth_blocks_per_s: float,
    ) -> StepInputs:
        """Validated inputs from array-likes; raises ValueError on bad shapes
        or values."""
        comp = np.asarray(comp_s, dtype=np.float64)
        blocks = np.asarray(kv_blocks, dtype=np.float64)
        placed = np.asarray(resident, dtype=np.bool_)
        if comp.ndim != 1:
            raise ValueError(f"comp_s must be 1-D (one per layer), got shape {comp.shape}")
        if blocks.ndim != 1:
            raise ValueError(f"kv_blocks must be 1-D (one per request), got {blocks.shape}")
        if placed.shape != (blocks.size, comp.size):
            raise ValueError(
                f"resident must have shape (requests, layers) = {(blocks.size, comp.size)}, "
                f"got {placed.shape}"
            )
        if not (np.isfinite(comp).all() and (comp >= 0).all()):
            raise ValueError("comp_s must be finite and >= 0")
        if not (np.isfinite(blocks).all() and (blocks >= 0).all()):
            raise ValueError("kv_blocks must be finite and >= 0")
        if not (math.isfinite(bandwidth_blocks_per_s) and bandwidth_blocks_per_s > 0):
            raise ValueError("bandwidth_blocks_per_s must be finite and > 0")
        return cls(comp, blocks, placed, float(bandwidth_blocks_per_s))

    @property
    def num_layers(self) -> int:
        return int(self.comp_s.size)

    @property
    def num_requests(self) -> int:
        return int(self.kv_blocks.size)

    def fetched_blocks_per_layer(self) -> FloatArray:
        """(L,) blocks crossing the link for each layer: sum_r (1 - x_rl) b_r."""
        fetched: FloatArray = self.kv_blocks @ (~self.resident)
        return fetched


@dataclass(frozen=True, slots=True)
class StepTimeline:
    """A latency model's prediction for one decode step, time 0 = step start.

    stall_s[l] = layer_start_s[l] - layer_end_s[l - 1] (the wait for KV before
    layer l; layer -1 ends at 0). fetch_start_s / fetch_end_s are (R, L), NaN
    where the layer is resident or the model does not time single fetches.
    """

    latency_s: float
    layer_start_s: FloatArray
    layer_end_s: FloatArray
    stall_s: FloatArray
    fetch_start_s: FloatArray
    fetch_end_s: FloatArray

    @property
    def total_stall_s(self) -> float:
        return float(self.stall_s.sum())


def timeline_from_stalls(
    comp_s: FloatArray, stall_s: FloatArray, num_requests: int
) -> StepTimeline:
    """The timeline of layers run back to back with stall_s[l] before each
    layer (for models that only predict stalls)."""
    layer_end = np.cumsum(comp_s + stall_s)
    layer_start = layer_end - comp_s
    untimed = np.full((num_requests, comp_s.size), np.nan)
    return StepTimeline(
        latency_s=float(layer_end[-1]) if layer_end.size else 0.0,
        layer_start_s=layer_start,
        layer_end_s=layer_end,
        stall_s=stall_s,
        fetch_start_s=untimed,
        fetch_end_s=untimed.copy(),
    )
