"""An ordered collection of request rows: the engine's queued, running, rotary
and in-transit lists. Each holds exactly the requests in its phase."""

from __future__ import annotations

import numpy as np

from planner.replay.state import IntArray, PhaseArray

_EMPTY: IntArray = np.zeros(0, dtype=np.int64)


class RequestQueue:
    """Rows in order. Every change makes a new array, so `rows` handed out
    earlier (to a scheduler's view) never change under their holder."""

    __slots__ = ("phase", "rows")

    def __init__(self, phase: int) -> None:
        self.phase = np.int8(phase)
        self.rows = _EMPTY

    def __len__(self) -> int:
        return len(self.rows)

    def last(self) -> int:
        return int(self.rows[-1])

    def extend(self, rows: IntArray) -> None:
        if len(rows):
            self.rows = np.concatenate((self.rows, rows))

    def push_front(self, rows: IntArray) -> None:
        self.rows = np.concatenate((rows, self.rows))

    def take_all(self) -> IntArray:
        rows = self.rows
        self.rows = _EMPTY
        return rows

    def drop_departed(self, phase: PhaseArray, leaving: IntArray | None = None) -> None:
        """Drop the rows whose phase is no longer this queue's; `leaving`,
        when given, are those rows (if they are the head, cheaper)."""
        head = len(leaving) if leaving is not None else 0
        if 0 < head <= len(self.rows) and (self.rows[:head] == leaving).all():
            self.rows = self.rows[head:]
        else:
            self.rows = self.rows[phase[self.rows] == self.phase]
