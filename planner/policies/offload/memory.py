"""GPU blocks a layer-offload placement needs (DESIGN.md §3.2 "Memory";
OrbitFlow Eq. 1), and the prefetch-buffer peak a predicted timeline really
reaches."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from planner.policies.offload.step import FloatArray, StepTimeline


def prefetch_buffer_blocks(kv_blocks: npt.ArrayLike, resident: npt.ArrayLike) -> FloatArray:
    """(...) B_buf = max_l sum_r (1 - x_rl) b_r: one layer's worth of fetched
    blocks. Broadcasts over leading axes of resident (..., R, L)."""
    blocks = np.asarray(kv_blocks, dtype=np.float64)
    offloaded = ~np.asarray(resident, dtype=np.bool_)
    fetched = np.einsum("r,...rl->...l", blocks, offloaded)
    if fetched.shape[-1] == 0:
        return np.zeros(fetched.shape[:-1])
    buffer: FloatArray = fetched.max(axis=-1)
    return buffer


def gpu_blocks_needed(kv_blocks: npt.ArrayLike, resident: npt.ArrayLike) -> FloatArray:
    """(...) sum_r sum_l b_r x_rl + B_buf, the left side of Eq. 1 (compare it
    with B_GPU, at the end of the decode window since KV grows during it)."""
    blocks = np.asarray(kv_blocks, dtype=np.float64)
    placed = np.asarray(resident, dtype=np.bool_)
    kept = np.einsum("r,...rl->...", blocks, placed)
    needed: FloatArray = kept + prefetch_buffer_blocks(blocks, placed)
    return needed


def peak_buffer_blocks(timeline: StepTimeline, kv_blocks: npt.ArrayLike) -> float:
    """Most fetched blocks held at once in a timeline: request r's fetch of
    layer l holds b_r blocks from its start until layer l has been computed.

    Under the exact model this can exceed prefetch_buffer_blocks, when
    requests fetch different layers at the same time (see event_model)."""
    blocks = np.asarray(kv_blocks, dtype=np.float64)
    rows, layers = np.nonzero(~np.isnan(timeline.fetch_start_s))
    if rows.size == 0:
        return 0.0
    starts = timeline.fetch_start_s[rows, layers]
    ends = timeline.layer_end_s[layers]
    times = np.concatenate((ends, starts))
    deltas = np.concatenate((-blocks[rows], blocks[rows]))
    # At equal times a slot is freed before the next fetch takes it.
    order = np.lexsort((deltas, times))
    return float(np.cumsum(deltas[order]).max())
