"""Azure LLM inference trace 2023 (conversation and code CSVs).

Columns TIMESTAMP (date and time with 7 decimals, no zone),
ContextTokens → prompt_tokens, GeneratedTokens → output_tokens. Arrivals are
seconds from the earliest timestamp (the first row: the files are sorted).
A token count of 0 is set to 1 and counted in the summary (the public files
have none). The code file has no final newline; that is fine.
"""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from planner.trace.importers.base import (
    Converter,
    ImportOptions,
    ImportSummary,
    SourceColumns,
    SourceRecord,
    at_least_one,
    csv_rows,
    parse_count,
)
from planner.trace.importers.columns import clamp_zeros
from planner.trace.importers.timestamps import parse_datetime_ns

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def read(path: Path, options: ImportOptions, summary: ImportSummary) -> list[SourceRecord]:
    records: list[SourceRecord] = []
    for line, row in csv_rows(path, COLUMNS, summary):
        time_ns = parse_datetime_ns(row["TIMESTAMP"], path, line, "TIMESTAMP")
        prompt = parse_count(row["ContextTokens"], path, line, "ContextTokens")
        output = parse_count(row["GeneratedTokens"], path, line, "GeneratedTokens")
        records.append(
            SourceRecord(
                line=line,
                time_ns=time_ns,
                prompt_tokens=at_least_one(prompt, summary, "ContextTokens"),
                output_tokens=at_least_one(output, summary, "GeneratedTokens"),
            )
        )
    return records


# What read_columns vouches for: a subset of what parse_datetime_ns and
# parse_count accept (no surrounding spaces, times of day in range, years
# whose nanoseconds fit an int64).
_TIMESTAMP = (
    r"^(1[7-9]|2[01])[0-9]{2}-[0-9]{2}-[0-9]{2}"
    r"[ T]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?$"
)
_COUNT = r"^[0-9]{1,18}$"


def read_columns(path: Path, summary: ImportSummary) -> SourceColumns | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None  # the strict reader says why
    if not data.startswith(b"TIMESTAMP,") or b'"' in data:
        return None
    if data.count(b"\r") != data.count(b"\r\n"):
        return None
    lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
    try:
        table = pa_csv.read_csv(
            io.BytesIO(data),
            convert_options=pa_csv.ConvertOptions(
                include_columns=list(COLUMNS),
                column_types=dict.fromkeys(COLUMNS, pa.string()),
            ),
        )
    except (pa.ArrowException, ValueError):
        return None
    if table.num_rows != lines - 1 or table.num_rows == 0:
        return None
    stamps = table["TIMESTAMP"]
    if not pc.all(pc.match_substring_regex(stamps, _TIMESTAMP)).as_py():
        return None
    counts = []
    for column in ("ContextTokens", "GeneratedTokens"):
        if not pc.all(pc.match_substring_regex(table[column], _COUNT)).as_py():
            return None
        counts.append(pc.cast(table[column], pa.int64()).to_numpy())
    try:
        time_ns = pc.cast(pc.cast(stamps, pa.timestamp("ns")), pa.int64()).to_numpy()
    except (pa.ArrowException, ValueError):
        return None  # an impossible date: the strict reader names it
    summary.rows += table.num_rows
    return SourceColumns(
        time_ns=time_ns,
        prompt_tokens=clamp_zeros(counts[0], summary, "ContextTokens"),
        output_tokens=clamp_zeros(counts[1], summary, "GeneratedTokens"),
    )


CONVERTER = Converter(
    name="azure",
    help="Azure LLM inference trace CSV: TIMESTAMP, ContextTokens, GeneratedTokens",
    read=read,
    read_columns=read_columns,
)
