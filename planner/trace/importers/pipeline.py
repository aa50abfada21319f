"""A conversion end to end: read the source, order it, put the origin at the
first row, cut the window, stamp, and (in the CLI) write atomically.

Order: records out of time order are sorted (stably) and counted; the public
files are all sorted. Origin: arrival_s is seconds from the earliest row.
Window: --start S and --duration D keep the requests with
S <= arrival_s < S + D and shift them so that S becomes 0 (the gap from the
window's start to its first request is kept); --limit N then keeps the
first N.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

from planner.input_file import InputFileError, check_regular_file
from planner.trace.atomic import atomic_write_lines
from planner.trace.errors import SpecError, TraceError
from planner.trace.importers import CONVERTERS
from planner.trace.importers.base import ImportOptions, ImportSummary, SourceRecord
from planner.trace.importers.columns import json_lines, order_and_window
from planner.trace.io import MAX_SOURCE_BYTES, write_trace
from planner.trace.records import TraceRequest
from planner.trace.stamp import Stamp


def check_window(options: ImportOptions) -> None:
    start = options.start_s
    if start is not None and not (math.isfinite(start) and start >= 0):
        raise SpecError("--start", f"must be a finite number >= 0, got {options.start_s}")
    if options.duration_s is not None and not (
        math.isfinite(options.duration_s) and options.duration_s > 0
    ):
        raise SpecError("--duration", f"must be a finite number > 0, got {options.duration_s}")
    if options.limit is not None and options.limit < 1:
        raise SpecError("--limit", f"must be >= 1, got {options.limit}")


def _ordered(records: list[SourceRecord], summary: ImportSummary) -> list[SourceRecord]:
    out_of_order = sum(1 for a, b in itertools.pairwise(records) if b.time_ns < a.time_ns)
    if out_of_order:
        records = sorted(records, key=lambda r: r.time_ns)
        summary.notes.append(f"{out_of_order} rows were earlier than the row before them; sorted")
    return records


def _windowed(
    records: list[SourceRecord], options: ImportOptions, summary: ImportSummary
) -> list[TraceRequest]:
    origin_ns = records[0].time_ns
    start_ns = round((options.start_s or 0.0) * 1e9)
    end_ns = None if options.duration_s is None else start_ns + round(options.duration_s * 1e9)
    out: list[TraceRequest] = []
    for record in records:
        offset_ns = record.time_ns - origin_ns
        if offset_ns < start_ns or (end_ns is not None and offset_ns >= end_ns):
            summary.outside_window += 1
            continue
        if options.limit is not None and len(out) >= options.limit:
            summary.over_limit += 1
            continue
        out.append(
            TraceRequest(
                arrival_s=(offset_ns - start_ns) / 1e9,
                prompt_tokens=record.prompt_tokens,
                output_tokens=record.output_tokens,
                model=record.model,
                tenant=record.tenant,
                prefix_block_ids=record.prefix_block_ids,
            )
        )
    return out


def _checked_source(fmt: str, source: str | Path, options: ImportOptions) -> Path:
    if fmt not in CONVERTERS:
        raise SpecError("--format", f"unknown format {fmt!r} (known: {', '.join(CONVERTERS)})")
    check_window(options)
    path = Path(source)
    try:
        check_regular_file(path, MAX_SOURCE_BYTES)
    except InputFileError as exc:
        raise TraceError(None, None, exc.reason, path=path) from None
    return path


def import_trace_to_file(
    fmt: str, source: str | Path, options: ImportOptions, stamp: Stamp, output: str | Path
) -> ImportSummary:
    """import_trace, then write_trace to `output`; by columns where the
    converter has a columnar reader that vouches for the source (the same
    requests, the same summary), else request by request."""
    path = _checked_source(fmt, source, options)
    read_columns = CONVERTERS[fmt].read_columns
    if read_columns is not None:
        summary = ImportSummary(format=fmt, source=str(source))
        columns = read_columns(path, summary)
        if columns is not None:
            trace = order_and_window(columns, options, summary)
            if len(trace) and trace.valid():
                atomic_write_lines(output, json_lines(trace, stamp))
                summary.written = len(trace)
                summary.first_arrival_s = float(trace.arrival_s[0])
                summary.last_arrival_s = float(trace.arrival_s[-1])
                return summary
    requests, summary = import_trace(fmt, source, options, stamp)
    summary.written = write_trace(output, requests)
    return summary


def import_trace(
    fmt: str, source: str | Path, options: ImportOptions, stamp: Stamp | None = None
) -> tuple[list[TraceRequest], ImportSummary]:
    """Convert `source` (of format `fmt`); the summary says what was dropped,
    changed and left out. Raises TraceError (bad source) or SpecError (bad
    options); returns at least one request."""
    path = _checked_source(fmt, source, options)
    converter = CONVERTERS[fmt]
    summary = ImportSummary(format=fmt, source=str(source))
    records = _ordered(converter.read(path, options, summary), summary)
    if not records:
        raise TraceError(None, None, "no requests in the source", path=path)
    requests = _windowed(records, options, summary)
    if not requests:
        raise TraceError(None, None, "no requests in the --start/--duration window", path=path)
    if stamp is not None:
        requests = stamp.apply(requests)
    summary.written = len(requests)
    summary.first_arrival_s = requests[0].arrival_s
    summary.last_arrival_s = requests[-1].arrival_s
    return requests, summary
