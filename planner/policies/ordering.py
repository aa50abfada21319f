"""Deterministic orderings of request rows: numeric keys, then id."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def order_rows(rows: IntArray, keys: Sequence[FloatArray], ids: Sequence[str]) -> IntArray:
    """rows sorted ascending by keys[0], then keys[1], ..., then by id.

    keys are indexed by row (full-table columns) and hold no NaN (replace it
    first; see nan_last). One unstable argsort on the first key; only rows in
    runs of equal first keys are re-sorted by the remaining keys, and only rows
    equal on every key by id, so the common case costs one argsort.
    """
    if rows.size < 2:
        return rows
    first = keys[0][rows]
    order = rows[np.argsort(first)]
    tied = _run_members(keys[0][order])
    if not tied.any():
        return order
    if len(keys) > 1:
        positions = np.flatnonzero(tied)
        sub = order[positions]
        order[positions] = sub[np.lexsort([key[sub] for key in reversed(keys)])]
    equal_all = np.ones(order.size - 1, dtype=np.bool_)
    for key in keys:
        column = key[order]
        equal_all &= column[1:] == column[:-1]
    if not equal_all.any():
        return order
    edges = np.flatnonzero(np.diff(np.concatenate(([0], equal_all.astype(np.int8), [0]))))
    for begin, end in zip(edges[0::2].tolist(), edges[1::2].tolist(), strict=True):
        run = order[begin : end + 1].tolist()
        order[begin : end + 1] = sorted(run, key=ids.__getitem__)
    return order


def _run_members(sorted_key: FloatArray) -> BoolArray:
    """Positions that belong to a run of two or more equal values."""
    equal_next = sorted_key[1:] == sorted_key[:-1]
    member = np.zeros(sorted_key.size, dtype=np.bool_)
    member[:-1] |= equal_next
    member[1:] |= equal_next
    return member


def nan_last(column: FloatArray) -> FloatArray:
    out: FloatArray = np.where(np.isnan(column), np.inf, column)
    return out
