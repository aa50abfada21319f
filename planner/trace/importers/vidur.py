"""Vidur request traces (microsoft/vidur data/processed_traces/*.csv, read
by its trace-replay request generator).

Columns arrived_at (seconds) → arrival_s (seconds from the first row),
num_prefill_tokens → prompt_tokens, num_decode_tokens → output_tokens.
Other columns (num_total_tokens, pd_ratio, ...) are ignored and named in the
summary. A file without arrived_at is one of Vidur's length-only files: it
is refused with a pointer to sharegpt-lengths, which generates arrivals. A
token count of 0 is set to 1 and counted, as Vidur clips it to 1.
"""

from __future__ import annotations

from pathlib import Path

from planner.trace.errors import TraceError
from planner.trace.importers.base import (
    Converter,
    ImportOptions,
    ImportSummary,
    SourceRecord,
    at_least_one,
    csv_rows,
    parse_count,
    parse_seconds_ns,
)

COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")


def read(path: Path, options: ImportOptions, summary: ImportSummary) -> list[SourceRecord]:
    records: list[SourceRecord] = []
    header: list[str] = []
    try:
        for line, row in csv_rows(path, COLUMNS, summary):
            header = header or list(row)
            records.append(
                SourceRecord(
                    line=line,
                    time_ns=parse_seconds_ns(row["arrived_at"], path, line, "arrived_at"),
                    prompt_tokens=at_least_one(
                        parse_count(row["num_prefill_tokens"], path, line, "num_prefill_tokens"),
                        summary,
                        "num_prefill_tokens",
                    ),
                    output_tokens=at_least_one(
                        parse_count(row["num_decode_tokens"], path, line, "num_decode_tokens"),
                        summary,
                        "num_decode_tokens",
                    ),
                )
            )
    except TraceError as exc:
        if exc.field == "arrived_at" and exc.line == 1:
            raise TraceError(
                1,
                "arrived_at",
                f"{exc.reason}; a file of lengths only is --format sharegpt-lengths "
                "(give --rate to generate arrivals)",
                path=path,
            ) from None
        raise
    extra = [name for name in header if name not in COLUMNS]
    if extra:
        summary.notes.append(f"ignored columns: {', '.join(extra)}")
    return records


CONVERTER = Converter(
    name="vidur",
    help="Vidur trace CSV: arrived_at (s), num_prefill_tokens, num_decode_tokens",
    read=read,
)
