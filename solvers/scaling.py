"""Float coefficients to integers for CP-SAT, with a known error bound.

Each row (and the objective) is multiplied by a power of two, 2**e. Rounding
a coefficient c_j * 2**e to the nearest integer moves the row by at most
0.5 * max|x_j| (scaled units); e is the least value that keeps the sum of
those moves within 2**-bits of the row's largest term range
R = max_j |c_j| * max|x_j|, while every coefficient that a smaller-or-equal
power of two makes an exact integer stays exact (all-integer rows keep e = 0).
A rounded row is widened by its worst-case rounding error (`slack`), so a
point feasible in the model stays feasible after scaling; a returned point
violates the original row by at most (2 * slack + 1) / 2**e
<= 2**(1 - bits) * R + 2**-e. solvers/README.md states the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

INT_LIMIT = 2**62
"""Right-hand sides are clipped to +-INT_LIMIT (CP-SAT works in int64)."""


def exact_exponent(coefs: FloatArray) -> IntArray:
    """Per coefficient: the least e >= 0 with coefs * 2**e an integer."""
    mant, expo = np.frexp(coefs)
    big = np.abs(np.ldexp(mant, 53)).astype(np.int64)  # 53-bit integer mantissa (0 for 0.0)
    low_bit = big & -big
    trailing = np.where(big > 0, np.log2(np.maximum(low_bit, 1)).astype(np.int64), 53)
    need: IntArray = np.maximum(53 - expo.astype(np.int64) - trailing, 0)
    return need


@dataclass(frozen=True)
class ScaledRows:
    coefs: IntArray
    """Integer coefficient per entry."""
    exponent: IntArray
    """Per row: the row was multiplied by 2**exponent."""
    slack: FloatArray
    """Per row: worst-case rounding error (in scaled units); 0 when exact."""


def _row_max(values: npt.NDArray[np.generic], start: IntArray, fill: float) -> FloatArray:
    """Per row of a CSR layout (`start` has n_rows + 1 offsets), the max of its
    entries; `fill` for an empty row."""
    n_rows = len(start) - 1
    if len(values) == 0:
        return np.full(n_rows, fill)
    nonempty = start[:-1] < start[1:]
    out = np.full(n_rows, fill)
    out[nonempty] = np.maximum.reduceat(values, start[:-1][nonempty])
    return out


def scale_rows(
    coefs: FloatArray,
    start: IntArray,
    entry_row: IntArray,
    var_max_abs: FloatArray,
    bits: int,
) -> ScaledRows:
    """Integer coefficients for rows in CSR layout (`start`: n_rows + 1
    offsets; `entry_row`: each entry's row); `var_max_abs` is max |value| of
    each entry's (integer) variable."""
    n_rows = len(start) - 1
    if n_rows == 0:
        return ScaledRows(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))
    term = np.abs(coefs) * var_max_abs
    live = term > 0  # entries that can move the row at all
    reach = _row_max(term, start, 0.0)

    def precision_exponent(entries: npt.NDArray[np.bool_]) -> IntArray:
        """Least e keeping sum(0.5 * max|x_j|) / 2**e <= 2**-bits * R over `entries`."""
        total = np.bincount(entry_row[entries], weights=var_max_abs[entries], minlength=n_rows)
        ratio = np.where((total > 0) & (reach > 0), total / np.where(reach > 0, reach, 1.0), 1.0)
        e = (bits - 1 + np.ceil(np.log2(ratio))).astype(np.int64)
        return np.where(total > 0, e, np.iinfo(np.int32).min)

    e_all = precision_exponent(live)
    at_all = np.ldexp(coefs, np.maximum(e_all, 0)[entry_row])
    inexact = live & (at_all != np.rint(at_all))
    e_inexact = precision_exponent(inexact)
    exact = np.flatnonzero(live & ~inexact)
    need = np.zeros(len(coefs), np.int64)
    need[exact] = exact_exponent(coefs[exact])
    kept_exact = _row_max(need, start, 0).astype(np.int64)
    exponent = np.maximum(e_inexact, kept_exact)
    scaled = np.ldexp(coefs, exponent[entry_row])
    ints = np.rint(scaled)
    err = np.abs(ints - scaled) * var_max_abs
    slack = np.asarray(np.bincount(entry_row, err, n_rows), dtype=np.float64)
    return ScaledRows(ints.astype(np.int64), exponent, slack)


def scale_bounds(rhs: FloatArray, exponent: IntArray, slack: FloatArray, upper: bool) -> IntArray:
    """A row's integer lower (upper=False) or upper bound: rhs * 2**exponent,
    widened by the slack and rounded outwards (a float-noise 2.9999999999 is 3)."""
    scaled = np.ldexp(rhs, exponent)
    tiny = 1e-9 * np.maximum(1.0, np.abs(scaled))
    out = np.floor(scaled + slack + tiny) if upper else np.ceil(scaled - slack - tiny)
    return np.clip(out, -INT_LIMIT, INT_LIMIT).astype(np.int64)


def scale_vector(
    coefs: FloatArray, var_max_abs: FloatArray, bits: int
) -> tuple[IntArray, int, float]:
    """One row (the objective): integer coefficients, the exponent, the slack."""
    start = np.array([0, len(coefs)], np.int64)
    rows = scale_rows(coefs, start, np.zeros(len(coefs), np.int64), var_max_abs, bits)
    return rows.coefs, int(rows.exponent[0]), float(rows.slack[0])
