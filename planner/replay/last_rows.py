"""The rows a small batch emits, as a list and as an array, kept from one
iteration to the next: a batch that emits the same rows as the last one takes
the same array instead of building one (some 0.4 us for a few rows, more than
the rest of the batch's own work), and emitting that array takes the same
list back. The array is read-only, so a shared one cannot be changed
behind another batch's back."""

from __future__ import annotations

import numpy as np

from planner.replay.state import IntArray


class LastRows:
    __slots__ = ("_array", "_rows")

    def __init__(self) -> None:
        self._rows: list[int] = []
        self._array: IntArray = _read_only([])

    def array(self, rows: list[int]) -> IntArray:
        """rows as a read-only array; the caller leaves rows as they are
        from now on."""
        if rows != self._rows:
            self._rows = rows
            self._array = _read_only(rows)
        return self._array

    def rows(self, array: IntArray) -> list[int]:
        """array's rows as a list (not to be changed)."""
        if array is self._array:
            return self._rows
        each: list[int] = array.tolist()
        return each


def _read_only(rows: list[int]) -> IntArray:
    array = np.array(rows, dtype=np.int64)
    array.setflags(write=False)
    return array
