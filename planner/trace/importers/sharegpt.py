"""ShareGPT length statistics (sarathi-serve's CSV: num_prefill_tokens,
num_decode_tokens, num_total_tokens, pd_ratio). The file has no times, so
arrivals are generated: a renewal process at --rate (or --rate-schedule)
with --burstiness (CV of the gaps; 1 = Poisson, the default), seeded by
--seed (default 0), one arrival per row in file order. As with every
converter, the first request arrives at 0. A count of 0 is set to 1 and
counted.
"""

from __future__ import annotations

from pathlib import Path

from planner.trace.arrivals import arrival_times
from planner.trace.errors import SpecError
from planner.trace.generate import seeded_streams
from planner.trace.importers.base import (
    Converter,
    ImportOptions,
    ImportSummary,
    SourceRecord,
    at_least_one,
    csv_rows,
    parse_count,
)

COLUMNS = ("num_prefill_tokens", "num_decode_tokens")


def read(path: Path, options: ImportOptions, summary: ImportSummary) -> list[SourceRecord]:
    if options.schedule is None:
        raise SpecError(
            "--rate", "sharegpt-lengths has no timestamps: give --rate or --rate-schedule"
        )
    if options.schedule.ends_at_zero:
        raise SpecError("--rate-schedule", "must end with a rate > 0 (every row needs an arrival)")
    rows: list[tuple[int, int, int]] = []
    for line, row in csv_rows(path, COLUMNS, summary):
        prompt = parse_count(row["num_prefill_tokens"], path, line, "num_prefill_tokens")
        output = parse_count(row["num_decode_tokens"], path, line, "num_decode_tokens")
        rows.append(
            (
                line,
                at_least_one(prompt, summary, "num_prefill_tokens"),
                at_least_one(output, summary, "num_decode_tokens"),
            )
        )
    if not rows:
        return []
    arrivals_rng, _ = seeded_streams(options.seed)
    times = arrival_times(
        options.schedule, options.burstiness, arrivals_rng, num_requests=len(rows)
    )
    summary.notes.append(
        f"arrivals generated: {options.schedule.describe()}, burstiness {options.burstiness:g}, "
        f"seed {options.seed}"
    )
    return [
        SourceRecord(
            line=line, time_ns=round(float(t) * 1e6) * 1000, prompt_tokens=p, output_tokens=o
        )
        for (line, p, o), t in zip(rows, times, strict=True)
    ]


CONVERTER = Converter(
    name="sharegpt-lengths",
    help="ShareGPT length stats CSV: num_prefill_tokens, num_decode_tokens "
    "(no times: needs --rate)",
    read=read,
    options=frozenset({"schedule", "burstiness", "seed"}),
)
