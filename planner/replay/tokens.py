"""Output token times. Each request owns a slice of one preallocated array,
as long as its output (at least one: a request that asked for none still
gets its first token). Its k-th token (k from 1) goes to slot first + k - 1,
which records when the token came as an index into the iterations' end
times. An iteration's emissions are one write; the per-request lists are cut
out once, at the end."""

from __future__ import annotations

import numpy as np

from planner.replay.scalar_columns import int_view
from planner.replay.state import IntArray


class TokenTimes:
    __slots__ = ("_before_first", "_ends_s", "_first", "_first_of", "_iteration", "_slots")

    def __init__(self, output_tokens: IntArray) -> None:
        sizes = np.maximum(output_tokens, 1)
        ends = np.cumsum(sizes)
        self._first: IntArray = ends - sizes
        self._before_first = self._first - 1
        # The same as Python ints, for a few rows at a time.
        self._first_of: list[int] = self._first.tolist()
        self._iteration = np.full(int(ends[-1]) if len(ends) else 0, -1, dtype=np.int32)
        # The same, written one slot at a time.
        self._slots = int_view(self._iteration)
        # When each iteration that emitted tokens ended; -1 above: no token yet.
        self._ends_s: list[float] = []

    def record(self, rows: IntArray, numbers: IntArray, time_s: float) -> None:
        """Each of rows emitted its token number numbers[i] at time_s."""
        self._iteration[self._before_first[rows] + numbers] = len(self._ends_s)
        self._ends_s.append(time_s)

    def record_rows(self, rows: list[int], before: list[int], time_s: float) -> None:
        """record for a few rows, one by one: each of rows emitted its token
        number before[i] + 1 at time_s."""
        iteration = self._slots
        first = self._first_of
        index = len(self._ends_s)
        for row, count in zip(rows, before, strict=True):
            iteration[first[row] + count] = index
        self._ends_s.append(time_s)

    def record_each(self, rows: IntArray, numbers: IntArray, times_s: list[float]) -> None:
        """Each of rows emitted one token at each of times_s, the first its
        token number numbers[i]."""
        later = np.arange(len(times_s))
        slots = (self._before_first[rows] + numbers)[:, None] + later
        self._iteration[slots] = len(self._ends_s) + later
        self._ends_s.extend(times_s)

    def recorded(self) -> IntArray:
        """How many tokens each request has recorded (a check: the engine's
        count of generated tokens must agree)."""
        written = (self._iteration >= 0).astype(np.int64)
        counts: IntArray = np.add.reduceat(written, self._first) if len(written) else self._first
        return counts

    def per_request(self, generated: IntArray) -> list[list[float]]:
        """Every request's token times (generated[i] of them), first first.
        The tokens of one iteration share one float object, as they would
        appending the engine's clock."""
        ends = np.array(self._ends_s, dtype=object)
        iteration = self._iteration
        return [
            ends[iteration[first : first + count]].tolist()
            for first, count in zip(self._first.tolist(), generated.tolist(), strict=True)
        ]
