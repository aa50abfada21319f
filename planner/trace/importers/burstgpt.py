"""BurstGPT (HPMLL/BurstGPT release CSVs).

Columns Timestamp (seconds) → arrival_s (seconds from the first row),
Model → model, Request tokens → prompt_tokens, Response tokens →
output_tokens, Log Type ("Conversation log" or "API log") → tenant,
verbatim. Total tokens is only checked: rows where it is not the sum are
counted in the summary. Failed requests are recorded with 0 response tokens
(the BurstGPT README says so); they are dropped and counted, since they
generated nothing. A request with 0 request tokens is kept with
prompt_tokens 1 and counted.
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
    parse_seconds_ns,
)

COLUMNS = (
    "Timestamp",
    "Model",
    "Request tokens",
    "Response tokens",
    "Total tokens",
    "Log Type",
)


def read(path: Path, options: ImportOptions, summary: ImportSummary) -> list[SourceRecord]:
    records: list[SourceRecord] = []
    bad_totals = 0
    for line, row in csv_rows(path, COLUMNS, summary):
        time_ns = parse_seconds_ns(row["Timestamp"], path, line, "Timestamp")
        prompt = parse_count(row["Request tokens"], path, line, "Request tokens")
        output = parse_count(row["Response tokens"], path, line, "Response tokens")
        total = parse_count(row["Total tokens"], path, line, "Total tokens")
        if total != prompt + output:
            bad_totals += 1
        if output == 0:
            summary.dropped["Response tokens 0 (failed request)"] += 1
            continue
        records.append(
            SourceRecord(
                line=line,
                time_ns=time_ns,
                prompt_tokens=at_least_one(prompt, summary, "Request tokens"),
                output_tokens=output,
                model=row["Model"].strip() or None,
                tenant=row["Log Type"].strip() or None,
            )
        )
    if bad_totals:
        summary.notes.append(
            f"{bad_totals} rows have Total tokens != Request tokens + Response tokens (ignored)"
        )
    return records


CONVERTER = Converter(
    name="burstgpt",
    help="BurstGPT CSV: Timestamp (s), Model, Request tokens, Response tokens, Total tokens, "
    "Log Type",
    read=read,
)
