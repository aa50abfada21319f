"""Least cost of freeing GPU memory, for the branch and bound's bounds
(search.py).

The requests still to place must free at least some number of blocks in the
memory row; each frees freed[r, c] at cost[r, c] under pattern c (0 for
nothing offloaded). The least total cost, with each request's choice relaxed
to a mix of its patterns, is the multiple-choice knapsack's LP relaxation:
take every request's lower convex hull of (freed, cost) from (0, 0), then its
segments cheapest per block first. That is a convex piecewise-linear function
of the blocks to free, tabulated once per search depth (the requests
order[depth:]) and read with np.interp.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class CoverCurve:
    """cost(depth, need): least cost for requests order[depth:] to free at
    least `need` blocks (+inf beyond what they can free)."""

    freed: FloatArray  # (R + 1, S + 1) cumulative freed at the breakpoints, per depth
    cost: FloatArray  # (R + 1, S + 1) cumulative cost at the breakpoints

    def at(self, depth: int, need: FloatArray) -> FloatArray:
        xs, ys = self.freed[depth], self.cost[depth]
        clipped = np.maximum(need, 0.0)
        out: FloatArray = np.interp(clipped, xs, ys)
        return np.where(clipped > xs[-1] * (1 + 1e-12) + 1e-9, np.inf, out)


def cover_curve(freed: FloatArray, cost: FloatArray, order: IntArray) -> CoverCurve:
    """freed, cost: (R, C) per request and pattern; order: the search's
    request order."""
    owner, slope, length = hull_segments(freed, cost)
    by_slope = np.argsort(slope, kind="stable")
    owner, slope, length = owner[by_slope], slope[by_slope], length[by_slope]
    position = np.empty(len(order), dtype=np.int64)
    position[order] = np.arange(len(order))
    # Depth d keeps the segments of requests placed at position >= d.
    kept = position[owner][None, :] >= np.arange(len(order) + 1)[:, None]
    zero = np.zeros((len(order) + 1, 1))
    xs = np.concatenate((zero, np.cumsum(np.where(kept, length, 0.0), axis=1)), axis=1)
    ys = np.concatenate((zero, np.cumsum(np.where(kept, slope * length, 0.0), axis=1)), axis=1)
    return CoverCurve(xs, ys)


def hull_segments(freed: FloatArray, cost: FloatArray) -> tuple[IntArray, FloatArray, FloatArray]:
    """Every request's lower convex hull from (0, 0) through its patterns
    that free anything, as segments (request, slope, length), found for all
    requests at once by walking from each hull point to the point of least
    slope beyond it (the farthest among ties)."""
    num_r = freed.shape[0]
    usable = freed > 0
    x = np.zeros(num_r)
    y = np.zeros(num_r)
    owners: list[IntArray] = []
    slopes: list[FloatArray] = []
    lengths: list[FloatArray] = []
    rows = np.arange(num_r)
    for _ in range(freed.shape[1]):
        ahead = usable & (freed > x[:, None])
        active = ahead.any(axis=1)
        if not active.any():
            break
        dx = np.where(ahead, freed - x[:, None], 1.0)
        slope = np.where(ahead, (cost - y[:, None]) / dx, np.inf)
        least = slope.min(axis=1, keepdims=True)
        ties = ahead & (slope <= least + 1e-12 * np.maximum(np.abs(least), 1.0))
        nxt = np.argmax(np.where(ties, freed, -np.inf), axis=1)
        step_x = freed[rows, nxt] - x
        step_y = cost[rows, nxt] - y
        owners.append(rows[active])
        slopes.append((step_y / np.where(step_x > 0, step_x, 1.0))[active])
        lengths.append(step_x[active])
        x = np.where(active, freed[rows, nxt], x)
        y = np.where(active, cost[rows, nxt], y)
    if not owners:
        return np.zeros(0, np.int64), np.zeros(0), np.zeros(0)
    return np.concatenate(owners), np.concatenate(slopes), np.concatenate(lengths)
