"""Mooncake (FAST'25) traces, JSON lines.

Fields timestamp (milliseconds) → arrival_s (seconds from the first row),
input_length → prompt_tokens, output_length → output_tokens, hash_ids (one
id per 512-token prefix block; equal ids are a shared prefix) →
prefix_block_ids. hash_ids may be absent (no prefix information). Other
fields are ignored and named in the summary. A length of 0 is set to 1 and
counted. Blank lines are skipped and counted.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from planner.trace.errors import show_value
from planner.trace.importers.base import (
    Converter,
    ImportOptions,
    ImportSummary,
    SourceRecord,
    at_least_one,
    json_count,
    parse_seconds_ns,
    source_error,
)

KNOWN = ("timestamp", "input_length", "output_length", "hash_ids")


def _time_ns(value: object, path: Path, line: int) -> int:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return parse_seconds_ns(repr(value), path, line, "timestamp", scale=10**6)
    raise source_error(
        path, line, "timestamp", f"must be a number (milliseconds), got {show_value(value)}"
    )


def _block_ids(value: object, path: Path, line: int) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise source_error(
            path, line, "hash_ids", f"must be a list of integers, got {show_value(value)}"
        )
    return tuple(json_count(v, path, line, f"hash_ids[{i}]") for i, v in enumerate(value))


def read(path: Path, options: ImportOptions, summary: ImportSummary) -> list[SourceRecord]:
    records: list[SourceRecord] = []
    extra: Counter[str] = Counter()
    blank = 0
    try:
        with path.open(encoding="utf-8-sig") as f:
            for line, text in enumerate(f, start=1):
                if not text.strip():
                    blank += 1
                    continue
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise source_error(
                        path, line, None, f"invalid JSON: {exc.msg} (column {exc.colno})"
                    ) from None
                if not isinstance(obj, dict):
                    raise source_error(path, line, None, "must be a JSON object")
                for key in ("timestamp", "input_length", "output_length"):
                    if key not in obj:
                        raise source_error(path, line, key, "required field is missing")
                extra.update(k for k in obj if k not in KNOWN)
                summary.rows += 1
                prompt = json_count(obj["input_length"], path, line, "input_length")
                output = json_count(obj["output_length"], path, line, "output_length")
                records.append(
                    SourceRecord(
                        line=line,
                        time_ns=_time_ns(obj["timestamp"], path, line),
                        prompt_tokens=at_least_one(prompt, summary, "input_length"),
                        output_tokens=at_least_one(output, summary, "output_length"),
                        prefix_block_ids=(
                            _block_ids(obj["hash_ids"], path, line) if "hash_ids" in obj else ()
                        ),
                    )
                )
    except UnicodeDecodeError as exc:
        raise source_error(path, None, None, f"not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise source_error(path, None, None, f"cannot read: {exc.strerror or exc}") from None
    if blank:
        summary.notes.append(f"skipped {blank} blank lines")
    if extra:
        names = ", ".join(f"{k} ({n})" for k, n in sorted(extra.items()))
        summary.notes.append(f"ignored fields: {names}")
    return records


CONVERTER = Converter(
    name="mooncake",
    help="Mooncake JSON lines: timestamp (ms), input_length, output_length, hash_ids",
    read=read,
)
