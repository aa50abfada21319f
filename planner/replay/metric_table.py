"""The side-by-side metric table every replay topology prints: sections of
rows, one column per policy, the best value of a ranked row in bold green."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from rich.table import Table
from rich.text import Text

M = TypeVar("M")
N = TypeVar("N")


# Not slots: a frozen slotted dataclass cannot be built through its
# subscripted alias (MetricRow[X](...) sets __orig_class__).
@dataclass(frozen=True)
class MetricRow(Generic[M]):
    label: str
    get: Callable[[M], float | None]
    fmt: Callable[[float | None], str]
    # Which way is better: +1 higher, -1 lower, 0 not ranked.
    better: int = 0


def lift_rows(rows: Sequence[MetricRow[M]], part: Callable[[N], M]) -> list[MetricRow[N]]:
    """`rows` read from the `part` of a topology's metrics (its
    PolicyMetrics, say)."""

    def lift(row: MetricRow[M]) -> MetricRow[N]:
        def get(m: N) -> float | None:
            return row.get(part(m))

        return MetricRow[N](row.label, get, row.fmt, row.better)

    return [lift(row) for row in rows]


def best_of(values: Sequence[float | None], better: int) -> set[int]:
    """Indices of the best values; none when all equal or no ranking."""
    present = [(i, v) for i, v in enumerate(values) if v is not None]
    if better == 0 or len(present) < 2:
        return set()
    pick = max if better > 0 else min
    target = pick(v for _, v in present)
    winners = {i for i, v in present if math.isclose(v, target, rel_tol=1e-9, abs_tol=1e-12)}
    return set() if len(winners) == len(present) else winners


def add_sections(
    table: Table, sections: Sequence[tuple[str, Sequence[MetricRow[M]]]], metrics: Sequence[M]
) -> Table:
    """Rows of `sections` for `metrics` (one column each, already added)."""
    for index, (section, rows) in enumerate(sections):
        table.add_row(Text(section, style="bold cyan"), *([""] * len(metrics)))
        for row in rows:
            values = [row.get(m) for m in metrics]
            best = best_of(values, row.better)
            cells = [
                Text(row.fmt(v), style="bold green" if i in best else "")
                for i, v in enumerate(values)
            ]
            table.add_row(Text("  " + row.label), *cells)
        if index < len(sections) - 1:
            table.add_section()
    return table
