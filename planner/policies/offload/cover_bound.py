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

    freed: list[FloatArray]  # per depth, cumulative freed at the breakpoints
    cost: list[FloatArray]  # per depth, cumulative cost at the breakpoints

    def at(self, depth: int, need: FloatArray) -> FloatArray:
        xs, ys = self.freed[depth], self.cost[depth]
        clipped = np.maximum(need, 0.0)
        out: FloatArray = np.interp(clipped, xs, ys)
        return np.where(clipped > xs[-1] * (1 + 1e-12) + 1e-9, np.inf, out)


def cover_curve(freed: FloatArray, cost: FloatArray, order: IntArray) -> CoverCurve:
    """freed, cost: (R, C) per request and pattern; order: the search's
    request order."""
    segments = [_hull_segments(freed[r], cost[r]) for r in range(freed.shape[0])]
    xs: list[FloatArray] = []
    ys: list[FloatArray] = []
    for depth in range(len(order) + 1):
        parts = [segments[int(r)] for r in order[depth:]]
        if parts:
            slope = np.concatenate([s for s, _ in parts])
            length = np.concatenate([n for _, n in parts])
        else:
            slope = length = np.zeros(0)
        by_slope = np.argsort(slope, kind="stable")
        xs.append(np.concatenate(([0.0], np.cumsum(length[by_slope]))))
        ys.append(np.concatenate(([0.0], np.cumsum((slope * length)[by_slope]))))
    return CoverCurve(xs, ys)


def _hull_segments(freed: FloatArray, cost: FloatArray) -> tuple[FloatArray, FloatArray]:
    """(slopes, lengths) of the lower convex hull of (0, 0) and the patterns
    that free anything, left to right (slopes ascending)."""
    useful = freed > 0
    points = sorted(zip(freed[useful].tolist(), cost[useful].tolist(), strict=True))
    hull: list[tuple[float, float]] = [(0.0, 0.0)]
    for x, y in points:
        if x == hull[-1][0]:
            if y >= hull[-1][1]:
                continue
            hull.pop()
        while len(hull) >= 2 and _turns_right_or_straight(hull[-2], hull[-1], (x, y)):
            hull.pop()
        hull.append((x, y))
    hx = np.array([h[0] for h in hull])
    hy = np.array([h[1] for h in hull])
    length = np.diff(hx)
    slope = np.diff(hy) / np.where(length > 0, length, 1.0)
    return slope, length


def _turns_right_or_straight(
    o: tuple[float, float], a: tuple[float, float], b: tuple[float, float]
) -> bool:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0]) <= 0
