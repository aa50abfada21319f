"""Which of the models resident on one slice runs the next iteration (they
take turns, each iteration streaming one model's weights): the one whose
most urgent request has the earliest deadline (TTFT deadline before its
first token; the time its mean TPOT would reach the target if no token came
after it), so a newcomer's prefill goes ahead of decodes that have banked
slack, and a decode whose slack runs out goes ahead of everything; ties in
turn order (round robin from the one after the last to run)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def next_turn(deadlines_s: Sequence[float | None], after: int) -> int | None:
    """The index of the resident to run: ``deadlines_s[i]`` is resident
    i's earliest deadline, None when it has nothing to run now; ``after``
    is the index of the last one that ran. None when nobody can run."""
    n = len(deadlines_s)
    best: int | None = None
    best_deadline = math.inf
    for k in range(1, n + 1):
        i = (after + k) % n
        d = deadlines_s[i]
        if d is not None and (best is None or d < best_deadline):
            best, best_deadline = i, d
    return best
