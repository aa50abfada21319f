"""Where a replay's documents go: a file written whole or not at all, or
standard output for the path ``-``.

Per-request tables (planner.replay.request_table) go to ``.csv`` or
``.parquet`` by the file's suffix; on standard output they are CSV.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from planner.trace.atomic import atomic_output

STDOUT = "-"
TABLE_SUFFIXES = (".csv", ".parquet")


def is_stdout(path: str | os.PathLike[str] | None) -> bool:
    return path is not None and os.fspath(path) == STDOUT


def table_suffix_error(path: str | os.PathLike[str]) -> str | None:
    """Why path cannot take a per-request table, or None."""
    if is_stdout(path):
        return None
    suffix = Path(path).suffix.lower()
    if suffix not in TABLE_SUFFIXES:
        return f"must end in {' or '.join(TABLE_SUFFIXES)} (or be - for CSV on standard output)"
    return None


def write_text(path: str | os.PathLike[str], text: str, stdout: TextIO) -> None:
    if is_stdout(path):
        stdout.write(text)
        stdout.flush()
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(target) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_document(path: str | os.PathLike[str], data: dict[str, Any], stdout: TextIO) -> None:
    write_text(path, json.dumps(data, indent=2, allow_nan=False) + "\n", stdout)


def write_table(path: str | os.PathLike[str], table: pd.DataFrame, stdout: TextIO) -> None:
    if is_stdout(path) or Path(path).suffix.lower() == ".csv":
        write_text(path, table.to_csv(index=False), stdout)
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(target) as tmp:
        table.to_parquet(tmp, index=False)
