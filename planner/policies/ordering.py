"""Deterministic orderings of request rows: numeric keys, then id."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def order_rows(rows: IntArray, keys: Sequence[FloatArray], ids: Sequence[str]) -> IntArray:
    """rows sorted ascending by keys[0], then keys[1], ..., then by id.

    keys are indexed by row (full-table columns); NaN must be replaced by the
    caller (lexsort puts NaN last, but equal NaNs are not ties).
    """
    if rows.size < 2:
        return rows
    columns = [key[rows] for key in keys]
    order = rows[np.lexsort(columns[::-1])]
    sorted_columns = [key[order] for key in keys]
    tied = np.ones(order.size - 1, dtype=np.bool_)
    for column in sorted_columns:
        tied &= column[1:] == column[:-1]
    if not tied.any():
        return order
    order = order.copy()
    edges = np.flatnonzero(np.diff(np.concatenate(([0], tied.astype(np.int8), [0]))))
    for begin, end in zip(edges[0::2].tolist(), edges[1::2].tolist(), strict=True):
        run = order[begin : end + 1].tolist()
        order[begin : end + 1] = sorted(run, key=ids.__getitem__)
    return order


def nan_last(column: FloatArray) -> FloatArray:
    out: FloatArray = np.where(np.isnan(column), np.inf, column)
    return out
