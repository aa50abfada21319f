"""What every converter shares: the record it yields, the options it may
take, the summary of what it dropped or changed, and strict field parsing
that names the source's file, line and column."""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path

import numpy as np
import numpy.typing as npt

from planner.trace.arrivals import RateSchedule
from planner.trace.errors import TraceError, show_value
from planner.trace.human import format_duration
from planner.trace.length_model import LengthModel


@dataclass(slots=True)
class SourceRecord:
    """One request of a source, its time in integer nanoseconds on the
    source's own clock (exact: no float rounding before the origin is
    subtracted)."""

    line: int
    time_ns: int
    prompt_tokens: int
    output_tokens: int
    model: str | None = None
    tenant: str | None = None
    prefix_block_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ImportOptions:
    limit: int | None = None
    start_s: float | None = None
    duration_s: float | None = None
    # sharegpt-lengths: arrivals
    schedule: RateSchedule | None = None
    burstiness: float = 1.0
    seed: int = 0
    # alibaba: lengths
    lengths: LengthModel | None = None


@dataclass(slots=True)
class ImportSummary:
    """What a conversion read, dropped, changed and wrote."""

    format: str
    source: str
    rows: int = 0  # data rows of the source (header and blank lines not counted)
    dropped: Counter[str] = field(default_factory=Counter)  # reason → rows
    changed: Counter[str] = field(default_factory=Counter)  # change → rows
    notes: list[str] = field(default_factory=list)
    outside_window: int = 0
    over_limit: int = 0
    written: int = 0
    first_arrival_s: float = 0.0
    last_arrival_s: float = 0.0

    def lines(self) -> list[str]:
        kept = self.rows - sum(self.dropped.values())
        out = [
            f"{self.format}: {self.rows:,} rows read from {self.source}, "
            f"{kept:,} kept, {self.written:,} written",
            f"arrivals {self.first_arrival_s:.3f} s .. {self.last_arrival_s:.3f} s, span "
            + format_duration(self.last_arrival_s - self.first_arrival_s),
        ]
        out += [f"dropped {n:,} rows: {reason}" for reason, n in sorted(self.dropped.items())]
        out += [f"changed {n:,} rows: {what}" for what, n in sorted(self.changed.items())]
        if self.outside_window:
            out.append(f"left out {self.outside_window:,} requests outside --start/--duration")
        if self.over_limit:
            out.append(f"left out {self.over_limit:,} requests beyond --limit")
        out += self.notes
        return out


Reader = Callable[[Path, ImportOptions, ImportSummary], list[SourceRecord]]
# The columnar reader (planner.trace.importers.columns): None where the
# strict Reader must decide.
ColumnReader = Callable[[Path, ImportSummary], "SourceColumns | None"]

Int64s = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class SourceColumns:
    """A source's requests as columns, in file order; times in integer
    nanoseconds on the source's own clock; token counts already >= 1."""

    time_ns: Int64s
    prompt_tokens: Int64s
    output_tokens: Int64s


@dataclass(frozen=True, slots=True)
class Converter:
    name: str
    help: str
    read: Reader
    options: frozenset[str] = frozenset()  # format-specific options it accepts
    read_columns: ColumnReader | None = None


def source_error(path: Path, line: int | None, column: str | None, reason: str) -> TraceError:
    return TraceError(line, column, reason, path=path)


def parse_count(text: str, path: Path, line: int, column: str) -> int:
    """A non-negative decimal integer ("374"); anything else is an error."""
    stripped = text.strip()
    if stripped.isascii() and stripped.isdigit():
        return int(stripped)
    raise source_error(path, line, column, f"must be an integer >= 0, got {show_value(text)}")


def json_count(value: object, path: Path, line: int, key: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise source_error(path, line, key, f"must be an integer >= 0, got {show_value(value)}")


def parse_seconds_ns(text: str, path: Path, line: int, column: str, scale: int = 10**9) -> int:
    """Decimal text of a time in some unit → integer nanoseconds, exactly
    (scale = nanoseconds per unit: 10**9 for seconds, 10**6 for ms)."""
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        value = Decimal("NaN")
    if not value.is_finite():
        raise source_error(path, line, column, f"must be a finite number, got {show_value(text)}")
    return int((value * scale).to_integral_value())


def at_least_one(value: int, summary: ImportSummary, what: str) -> int:
    """Clamp a token count of 0 to 1, counting the change."""
    if value >= 1:
        return value
    summary.changed[f"{what} 0 set to 1"] += 1
    return 1


def csv_rows(
    path: Path, columns: tuple[str, ...], summary: ImportSummary
) -> Iterator[tuple[int, dict[str, str]]]:
    """Data rows of a CSV file with a header naming at least `columns`,
    with the line number of each. Blank lines are skipped and noted; a row
    with the wrong number of cells is an error."""
    blank = 0
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise source_error(path, None, None, "empty file (no header)")
            names = [h.strip() for h in header]
            missing = [c for c in columns if c not in names]
            if missing:
                raise source_error(
                    path, 1, missing[0], f"missing column (header: {', '.join(names)})"
                )
            for cells in reader:
                if not cells or all(not c.strip() for c in cells):
                    blank += 1
                    continue
                if len(cells) != len(names):
                    raise source_error(
                        path,
                        reader.line_num,
                        None,
                        f"expected {len(names)} cells, got {len(cells)}",
                    )
                summary.rows += 1
                yield reader.line_num, dict(zip(names, cells, strict=True))
    except UnicodeDecodeError as exc:
        raise source_error(path, None, None, f"not UTF-8 text ({exc.reason})") from None
    except csv.Error as exc:
        raise source_error(path, None, None, f"bad CSV: {exc}") from None
    except OSError as exc:
        raise source_error(path, None, None, f"cannot read: {exc.strerror or exc}") from None
    if blank:
        summary.notes.append(f"skipped {blank} blank lines")
