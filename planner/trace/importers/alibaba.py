"""Alibaba cluster-trace-v2026-GenAI (GenTD26) lora_request_trace.csv.

A diffusion-serving trace: it gives per-model arrival times, not token
counts. gmt_create (date and time, whole seconds) → arrival_s (seconds from
the first row), checkpoint_model_version_id → model. Every status (SUCCEED,
FAILED, PENDING, PROCESSING) is an arrival and is kept; rows with no
checkpoint_model_version_id (a few PENDING ones) are dropped and counted.
Token counts come from options, drawn per kept row in file order with
--seed (default 0): --prompt-tokens N --output-tokens N (fixed), --lengths
PRESET|SPEC, --prompt-lengths/--output-lengths SPEC, or --lengths-file FILE
(pairs resampled). One of them is required. The trace spans about three
weeks: --start/--duration/--limit cut a window.
"""

from __future__ import annotations

from pathlib import Path

from planner.trace.errors import SpecError
from planner.trace.generate import seeded_streams
from planner.trace.importers.base import (
    Converter,
    ImportOptions,
    ImportSummary,
    SourceRecord,
    csv_rows,
)
from planner.trace.importers.timestamps import parse_datetime_ns

COLUMNS = ("gmt_create", "checkpoint_model_version_id")


def read(path: Path, options: ImportOptions, summary: ImportSummary) -> list[SourceRecord]:
    if options.lengths is None:
        raise SpecError(
            "--lengths",
            "alibaba has no token counts: give --prompt-tokens and --output-tokens, "
            "--lengths PRESET|SPEC, or --lengths-file FILE",
        )
    kept: list[tuple[int, int, str]] = []
    for line, row in csv_rows(path, COLUMNS, summary):
        time_ns = parse_datetime_ns(row["gmt_create"], path, line, "gmt_create")
        model = row["checkpoint_model_version_id"].strip()
        if not model:
            summary.dropped["no checkpoint_model_version_id"] += 1
            continue
        kept.append((line, time_ns, model))
    _, lengths_rng = seeded_streams(options.seed)
    prompts, outputs = options.lengths.sample(lengths_rng, len(kept))
    summary.notes.append(f"token counts: {options.lengths.describe()}, seed {options.seed}")
    return [
        SourceRecord(line=line, time_ns=t, prompt_tokens=int(p), output_tokens=int(o), model=model)
        for (line, t, model), p, o in zip(kept, prompts, outputs, strict=True)
    ]


CONVERTER = Converter(
    name="alibaba",
    help="Alibaba GenTD26 lora_request_trace.csv: gmt_create, checkpoint_model_version_id "
    "(no token counts: needs --prompt-tokens/--output-tokens, --lengths or --lengths-file)",
    read=read,
    options=frozenset({"lengths", "seed"}),
)
