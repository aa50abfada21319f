"""Azure LLM inference trace 2023 (conversation and code CSVs).

Columns TIMESTAMP (date and time with 7 decimals, no zone),
ContextTokens → prompt_tokens, GeneratedTokens → output_tokens. Arrivals are
seconds from the earliest timestamp (the first row: the files are sorted).
A token count of 0 is set to 1 and counted in the summary (the public files
have none). The code file has no final newline; that is fine.
"""

from __future__ import annotations

from pathlib import Path

from planner.trace.importers.base import (
    Converter,
    ImportOptions,
    ImportSummary,
    SourceRecord,
    at_least_one,
    csv_rows,
    parse_count,
)
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


CONVERTER = Converter(
    name="azure",
    help="Azure LLM inference trace CSV: TIMESTAMP, ContextTokens, GeneratedTokens",
    read=read,
)
