"""Read (prompt, output) length pairs from a file, for --lengths-file.

CSV (with a header) or JSON lines, recognised by the file's extension
(.csv, .jsonl / .json). The columns or keys may be any one of these pairs:
prompt_tokens/output_tokens (our traces), num_prefill_tokens/num_decode_tokens
(ShareGPT stats), ContextTokens/GeneratedTokens (Azure),
input_length/output_length (Mooncake), "Request tokens"/"Response tokens"
(BurstGPT). Other columns are ignored. Values must be integers >= 0; a pair
with a 0 (a failed request, say) is skipped and counted.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner.input_file import InputFileError, check_regular_file
from planner.trace.errors import TraceError, show_value
from planner.trace.io import MAX_SOURCE_BYTES
from planner.trace.length_model import Resampled

PAIRS: tuple[tuple[str, str], ...] = (
    ("prompt_tokens", "output_tokens"),
    ("num_prefill_tokens", "num_decode_tokens"),
    ("ContextTokens", "GeneratedTokens"),
    ("input_length", "output_length"),
    ("Request tokens", "Response tokens"),
)


@dataclass(frozen=True, slots=True)
class LengthsFile:
    lengths: Resampled
    rows: int
    skipped_zero: int


def _pair(keys: Mapping[str, object] | list[str], path: Path, line: int) -> tuple[str, str]:
    for pair in PAIRS:
        if pair[0] in keys and pair[1] in keys:
            return pair
    known = "; ".join("/".join(p) for p in PAIRS)
    raise TraceError(line, None, f"no length columns (expected one of: {known})", path=path)


def _count(value: object, path: Path, line: int, field: str) -> int:
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return int(text)
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise TraceError(line, field, f"must be an integer >= 0, got {show_value(value)}", path=path)


def _csv_rows(path: Path) -> Iterator[tuple[int, Mapping[str, object]]]:
    with path.open(encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None:
            raise TraceError(None, None, "empty file", path=path)
        for row in reader:
            yield reader.line_num, row


def _jsonl_rows(path: Path) -> Iterator[tuple[int, Mapping[str, object]]]:
    with path.open(encoding="utf-8-sig") as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceError(line, None, f"invalid JSON: {exc.msg}", path=path) from None
            if not isinstance(obj, dict):
                raise TraceError(line, None, "must be a JSON object", path=path)
            yield line, obj


def read_lengths_file(path: str | Path) -> LengthsFile:
    source = Path(path)
    suffix = source.suffix.lower()
    if suffix == ".csv":
        rows_iter = _csv_rows(source)
    elif suffix in (".jsonl", ".json"):
        rows_iter = _jsonl_rows(source)
    else:
        raise TraceError(None, None, "--lengths-file must be a .csv or .jsonl file", path=source)
    try:
        check_regular_file(source, MAX_SOURCE_BYTES)
    except InputFileError as exc:
        raise TraceError(None, None, exc.reason, path=source) from None
    prompts: list[int] = []
    outputs: list[int] = []
    rows = skipped = 0
    pair: tuple[str, str] | None = None
    try:
        for line, row in rows_iter:
            if pair is None:
                pair = _pair(row, source, line)
            rows += 1
            prompt = _count(row.get(pair[0]), source, line, pair[0])
            output = _count(row.get(pair[1]), source, line, pair[1])
            if prompt == 0 or output == 0:
                skipped += 1
                continue
            prompts.append(prompt)
            outputs.append(output)
    except UnicodeDecodeError as exc:
        raise TraceError(None, None, f"not UTF-8 text ({exc.reason})", path=source) from None
    except OSError as exc:
        raise TraceError(None, None, f"cannot read: {exc.strerror or exc}", path=source) from None
    if not prompts:
        raise TraceError(None, None, "no usable (prompt, output) length pairs", path=source)
    lengths = Resampled(
        np.asarray(prompts, dtype=np.int64), np.asarray(outputs, dtype=np.int64), source.name
    )
    return LengthsFile(lengths, rows, skipped)
