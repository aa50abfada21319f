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
    runs of equal first keys are re-sorted (stably) by the remaining keys, and
    only rows equal on every key by id, so the common case costs one argsort.
    """
    if rows.size < 2:
        return rows
    order = rows[keys[0][rows].argsort()]
    first = keys[0][order]
    tied = _run_members(first)
    if not tied.any():
        return order
    positions = tied.nonzero()[0]
    sub = order[positions]
    # Each tied row's keys as one integer that orders like them: the dense
    # rank of its first key among the tied, then of each further key.
    rank = _steps(first[positions])
    for i, key in enumerate(keys[1:], start=2):
        rank = rank * (len(sub) + 1) + _dense_rank(key[sub])
        if i < len(keys):
            rank = _dense_rank(rank)
    if len(keys) > 1:
        resort = rank.argsort(kind="stable")
        sub, rank = sub[resort], rank[resort]
        order[positions] = sub
    equal_all = rank[1:] == rank[:-1]
    if not equal_all.any():
        return order
    # Rows equal on every key lie next to each other in order, too.
    edges = np.diff(np.concatenate(([0], equal_all.astype(np.int8), [0]))).nonzero()[0]
    for begin, end in zip(edges[0::2].tolist(), edges[1::2].tolist(), strict=True):
        first_at, last_at = int(positions[begin]), int(positions[end])
        run = order[first_at : last_at + 1].tolist()
        order[first_at : last_at + 1] = sorted(run, key=ids.__getitem__)
    return order


def _steps(sorted_values: FloatArray | IntArray) -> IntArray:
    """Dense ranks of ascending values (0 for the smallest)."""
    steps = np.zeros(sorted_values.size, dtype=np.int64)
    np.cumsum(sorted_values[1:] != sorted_values[:-1], out=steps[1:])
    return steps


def _dense_rank(values: FloatArray | IntArray) -> IntArray:
    """Dense ranks of values (equal values, equal ranks; 0 for the smallest)."""
    order = values.argsort()
    rank = np.empty(values.size, dtype=np.int64)
    rank[order] = _steps(values[order])
    return rank


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
