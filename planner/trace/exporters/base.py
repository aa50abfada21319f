"""What every exporter shares: the rows it writes, what it keeps and drops,
and one atomic CSV writer."""

from __future__ import annotations

import csv
import io
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from planner.trace.atomic import atomic_write_lines
from planner.trace.records import TraceRequest

# Fields of TraceRequest an exporter may leave out; each dropped one is
# counted per request that had it set.
OPTIONAL_FIELDS = (
    "id",
    "model",
    "tenant",
    "priority",
    "slo_ttft_s",
    "slo_tbt_s",
    "prefix_block_ids",
)

Rows = Callable[[Sequence[TraceRequest]], Iterator[Sequence[object]]]


@dataclass(frozen=True, slots=True)
class Exporter:
    name: str
    help: str
    header: tuple[str, ...]
    rows: Rows
    kept: tuple[str, ...]  # fields of the trace the format carries
    notes: tuple[str, ...] = ()  # what the consuming tool does with it


@dataclass(slots=True)
class ExportSummary:
    format: str
    written: int = 0
    dropped: Counter[str] = field(default_factory=Counter)  # field → requests that had it

    def lines(self) -> list[str]:
        out = [f"{self.format}: {self.written:,} requests written"]
        out += [
            f"dropped {field_name} (set on {n:,} requests): {self.format} does not carry it"
            for field_name, n in sorted(self.dropped.items())
        ]
        return out


def _csv_line(cells: Sequence[object]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="").writerow(cells)
    return buffer.getvalue()


def export_trace(
    exporter: Exporter, requests: Sequence[TraceRequest], path: str | Path
) -> ExportSummary:
    """Write `requests` (a loaded, valid trace) in the exporter's format,
    atomically; the summary counts the fields the format cannot carry."""
    summary = ExportSummary(format=exporter.name, written=len(requests))
    for name in OPTIONAL_FIELDS:
        if name in exporter.kept:
            continue
        count = sum(1 for r in requests if getattr(r, name) not in (None, ()))
        if count:
            summary.dropped[name] = count

    def lines() -> Iterator[str]:
        yield _csv_line(exporter.header)
        for cells in exporter.rows(requests):
            yield _csv_line(cells)

    atomic_write_lines(path, lines())
    return summary
