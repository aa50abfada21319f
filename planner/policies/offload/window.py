"""The decode window's SLO arithmetic (DESIGN.md §3.2, OrbitFlow §3.3.1
"Self-Determined Decode Window" and §3.2 Token-Deposit).

A violation at a step is a request whose step latency exceeds its TBT SLO
while its Token-Deposit is empty. With a constant step latency T over the
window, a request with SLO s and d0 deposited tokens accrues one token per
step and has one delivered per s seconds: by step t (1-indexed) it owes
t * T / s deliveries and has had d0 + t tokens, so it runs dry, and every
step from then on is a violation, once t * (T / s - 1) > d0. Over a window of
w steps it therefore violates max(0, w - floor(d0 / (T / s - 1))) times when
T > s, and never when T <= s (its deposit only grows). A request that
finishes inside the window violates only over its remaining steps.

The window constraint averages violations over the window:
sum_r violations_r(T, w) <= alpha * w. Violations grow with T, so the
constraint is a latency ceiling T <= latency_ceiling_s(w); that ceiling is
what the ILP enforces. It is infinite when even an unbounded latency is
allowed (the batch has at most alpha requests).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def violations(
    step_s: float,
    window_steps: int,
    deposit_tokens: IntArray,
    slo_tbt_s: FloatArray,
    steps_left: IntArray | None = None,
) -> IntArray:
    """Violations of each request over a window of constant step latency.
    steps_left caps each request's steps (its remaining tokens; < 0 or None:
    unknown, the whole window)."""
    steps = _steps(window_steps, steps_left, deposit_tokens.shape[0])
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # A target too small to represent the ratio gives inf: always over.
        over = step_s / slo_tbt_s - 1.0
        # The tolerance keeps a latency exactly at a jump (as latency_ceiling_s
        # computes them) on the lower side of it despite rounding.
        ratio = deposit_tokens / np.where(over > 0, over, 1.0)
        dry_after = np.where(over > 0, np.floor(ratio * (1 + 1e-12) + 1e-12), 0)
    counts = np.where(over > 0, np.maximum(steps - dry_after, 0), 0)
    return counts.astype(np.int64)


def violations_per_step(
    step_s: float,
    window_steps: int,
    deposit_tokens: IntArray,
    slo_tbt_s: FloatArray,
    steps_left: IntArray | None = None,
) -> float:
    """The window constraint's left-hand side: violations averaged per step."""
    total = violations(step_s, window_steps, deposit_tokens, slo_tbt_s, steps_left).sum()
    return float(total) / window_steps


def latency_ceiling_s(
    window_steps: int,
    deposit_tokens: IntArray,
    slo_tbt_s: FloatArray,
    violation_cap: float,
    steps_left: IntArray | None = None,
) -> float:
    """The largest constant step latency whose violations, averaged over the
    window, stay within the cap (math.inf when any latency does)."""
    if window_steps < 1:
        raise ValueError("window_steps must be >= 1")
    n = deposit_tokens.shape[0]
    allowed = violation_cap * window_steps
    steps = _steps(window_steps, steps_left, n)
    if int(steps.sum()) <= allowed:
        return math.inf
    # Each request's violation count steps up just above T = s and just
    # above T = s * (1 + d0 / k) for k = 1..steps: the ceiling is one of these.
    k = np.arange(1, window_steps + 1, dtype=np.float64)
    with np.errstate(divide="ignore"):
        jumps = slo_tbt_s[:, None] * (1.0 + deposit_tokens[:, None] / k[None, :])
    jumps = np.where(k[None, :] <= steps[:, None], jumps, np.inf)
    candidates = np.unique(np.concatenate([slo_tbt_s, jumps.ravel()]))
    candidates = candidates[np.isfinite(candidates)]
    lo, hi = 0, candidates.shape[0] - 1
    best = -1
    while lo <= hi:
        mid = (lo + hi) // 2
        t = float(candidates[mid])
        if int(violations(t, window_steps, deposit_tokens, slo_tbt_s, steps_left).sum()) <= allowed:
            best = mid
            lo = mid + 1
        else:
            hi = mid - 1
    # Below the smallest SLO nobody violates, so candidates[0] is feasible.
    return float(candidates[max(best, 0)])


def _steps(window_steps: int, steps_left: IntArray | None, n: int) -> IntArray:
    if steps_left is None:
        return np.full(n, window_steps, dtype=np.int64)
    return np.where(steps_left < 0, window_steps, np.minimum(steps_left, window_steps))
