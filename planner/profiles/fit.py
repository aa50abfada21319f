"""Fitting the iteration cost model (planner.profiles.cost) to times measured
on a real engine.

Whatever drives the engine knows, for each measured time, which iterations
it spans and what each of them did (from a replay of the same requests, or
from the engine's own step log): a time is a fixed latency plus the sum of
those iterations' times. With the linear part of the cost model,

    t(P, D, A, S) = overhead_s + prefill_s_per_token * P + decode_s_per_token * D
                    + attn_s_per_context_token * A + prefill_s_per_sequence * S

(S: the sequences the iteration prefills), every measured time is linear in
the constants:

    measured = latency_s + overhead_s * iterations + prefill_s_per_token * sum P
               + decode_s_per_token * sum D + attn_s_per_context_token * sum A
               + prefill_s_per_sequence * sum S

so the constants are a non-negative least-squares fit (Lawson-Hanson), each
row divided by its measured time (the fit minimizes relative errors: a 10 ms
time counts as much as a 10 s one), after which rows whose residual is an
outlier (more than ``trim`` scaled median absolute deviations from the
median, a background process stealing the CPU during that probe) are dropped
and the fit is made again.

The weights-read floor of the cost model is not fitted (it is 0 in a fitted
profile): on a CPU there is no roofline; on a GPU the fitted overhead absorbs
the floor of small batches. ``latency_s`` is what a client sees beyond the
engine's iterations (the HTTP round trip, tokenization, detokenization and
streaming): a measured profile's ``request_latency_s``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]

# The columns of a design row, in order.
FIT_TERMS: tuple[str, ...] = (
    "latency_s",
    "overhead_s",
    "prefill_s_per_token",
    "decode_s_per_token",
    "attn_s_per_context_token",
    "prefill_s_per_sequence",
)
# Scaled MADs beyond which a row is an outlier.
DEFAULT_TRIM = 3.5
_MAD_SCALE = 1.4826
# A row this close to the fit (relative) is never dropped, however tight
# the others are.
_NEVER_AN_OUTLIER = 1e-3
_TRIM_ROUNDS = 8


class IterationTime(Protocol):
    """An iteration cost model (what the replay engine times iterations with)."""

    def iteration_time_s(
        self, prefill_tokens: int, decode_tokens: int, attended_context_tokens: int
    ) -> float: ...


class RecordingCost:
    """An iteration cost model that remembers what each iteration did (its
    prefill, decode and attended-context tokens), in call order."""

    def __init__(self, base: IterationTime) -> None:
        self.base = base
        self.iterations: list[tuple[int, int, int]] = []

    def iteration_time_s(
        self, prefill_tokens: int, decode_tokens: int, attended_context_tokens: int
    ) -> float:
        self.iterations.append((prefill_tokens, decode_tokens, attended_context_tokens))
        return self.base.iteration_time_s(prefill_tokens, decode_tokens, attended_context_tokens)


@dataclass(frozen=True, slots=True)
class LinearCost:
    """The linear cost model: what a fit gives, and a cost model the replay
    engine can run (IterationCost; the engine charges prefill_s_per_sequence
    itself, EngineConfig.prefill_s_per_sequence)."""

    overhead_s: float
    prefill_s_per_token: float
    decode_s_per_token: float
    attn_s_per_context_token: float
    prefill_s_per_sequence: float = 0.0

    def iteration_time_s(
        self, prefill_tokens: int, decode_tokens: int, attended_context_tokens: int
    ) -> float:
        if prefill_tokens + decode_tokens == 0 and attended_context_tokens == 0:
            return 0.0
        return (
            self.overhead_s
            + self.prefill_s_per_token * prefill_tokens
            + self.decode_s_per_token * decode_tokens
            + self.attn_s_per_context_token * attended_context_tokens
        )

    def constants(self) -> dict[str, float]:
        """As profile cost constants (the floor and the pair term are 0)."""
        return {
            "overhead_s": self.overhead_s,
            "weights_floor_s": 0.0,
            "prefill_s_per_token": self.prefill_s_per_token,
            "decode_s_per_token": self.decode_s_per_token,
            "attn_s_per_context_token": self.attn_s_per_context_token,
            "prefill_attn_s_per_pair": 0.0,
            "prefill_s_per_sequence": self.prefill_s_per_sequence,
        }


@dataclass(frozen=True, slots=True)
class CostFit:
    cost: LinearCost
    latency_s: float
    rows: int
    dropped: int
    # Relative errors (fitted / measured - 1) of the rows kept.
    relative_errors: FloatArray

    @property
    def median_abs_error(self) -> float:
        e = self.relative_errors
        return float(np.median(np.abs(e))) if e.size else math.nan

    @property
    def p90_abs_error(self) -> float:
        e = self.relative_errors
        return float(np.percentile(np.abs(e), 90)) if e.size else math.nan


def nnls(a: FloatArray, b: FloatArray, max_iterations: int | None = None) -> FloatArray:
    """argmin ||a x - b|| subject to x >= 0 (Lawson and Hanson's active-set
    method, their NNLS algorithm, chapter 23)."""
    m, n = a.shape
    if b.shape != (m,):
        raise ValueError(f"b must have shape ({m},), got {b.shape}")
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tolerance = 10 * np.finfo(float).eps * max(1.0, float(np.abs(a).max(initial=0.0))) * max(m, n)
    limit = max_iterations if max_iterations is not None else 3 * n + 30
    for _ in range(limit):
        w = a.T @ (b - a @ x)
        candidates = ~passive & (w > tolerance)
        if not candidates.any():
            break
        passive[int(np.argmax(np.where(candidates, w, -np.inf)))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            blocking = passive & (z <= 0)
            step = np.min(x[blocking] / (x[blocking] - z[blocking]))
            x = x + step * (z - x)
            passive &= x > tolerance
            x[~passive] = 0.0
    return x


def fit_costs(
    rows: Sequence[Sequence[float]],
    measured_s: Sequence[float],
    trim: float = DEFAULT_TRIM,
) -> CostFit:
    """rows: per measured time, (iterations, sum P, sum D, sum A, sum S) of
    the iterations it spans (finite, >= 0); measured_s: the times (> 0).
    Fits latency_s and the five constants (module docstring). ValueError, naming
    the row and the term, when there are fewer rows than terms, a time is
    not > 0 or a count is negative or not finite."""
    x = np.asarray(rows, dtype=np.float64)
    y = np.asarray(measured_s, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != len(FIT_TERMS) - 1:
        raise ValueError(f"rows must have {len(FIT_TERMS) - 1} columns, got shape {x.shape}")
    if y.shape != (x.shape[0],):
        raise ValueError(f"one measured time per row: {x.shape[0]} rows, {y.shape} times")
    if x.shape[0] < len(FIT_TERMS):
        raise ValueError(f"at least {len(FIT_TERMS)} measured times needed, got {x.shape[0]}")
    if not (np.isfinite(y).all() and (y > 0).all()):
        raise ValueError("every measured time must be a finite number > 0")
    for column, term in enumerate(FIT_TERMS[1:]):
        values = x[:, column]
        if not (np.isfinite(values).all() and (values >= 0).all()):
            row = int(np.flatnonzero(~(np.isfinite(values) & (values >= 0)))[0])
            raise ValueError(
                f"row {row}: the count multiplying {term} must be a finite number >= 0, "
                f"got {values[row]}"
            )
    design = np.column_stack((np.ones(len(y)), x))
    keep = np.ones(len(y), dtype=bool)
    solution = _relative_fit(design, y, keep)
    # Drop the outliers of the fit on the rows kept, judging every row again
    # each time (one dropped only because the first fit leaned towards the
    # outliers comes back), until the kept rows do not change.
    for _ in range(_TRIM_ROUNDS):
        relative = design @ solution / y - 1.0
        kept = relative[keep]
        centre = float(np.median(kept))
        spread = _MAD_SCALE * float(np.median(np.abs(kept - centre)))
        chosen = np.abs(relative - centre) <= max(trim * spread, _NEVER_AN_OUTLIER)
        if chosen.sum() < len(FIT_TERMS) or (chosen == keep).all():
            break
        keep = chosen
        solution = _relative_fit(design, y, keep)
    relative = design[keep] @ solution / y[keep] - 1.0
    latency, overhead, prefill, decode, attn, per_sequence = (float(v) for v in solution)
    return CostFit(
        cost=LinearCost(overhead, prefill, decode, attn, per_sequence),
        latency_s=latency,
        rows=int(keep.sum()),
        dropped=int((~keep).sum()),
        relative_errors=relative,
    )


def _relative_fit(design: FloatArray, y: FloatArray, keep: NDArray[np.bool_]) -> FloatArray:
    """NNLS on the rows kept, each divided by its measured time; columns
    scaled to unit norm first so that seconds per token and seconds per
    iteration weigh alike in the active-set steps."""
    a = design[keep] / y[keep, None]
    b = np.ones(int(keep.sum()))
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    scaled: FloatArray = nnls(a / norms, b) / norms
    return scaled
