"""The columnar reader of a trace (pyarrow), for files the strict line
reader of `planner.trace.io` would accept.

It parses the whole file at once against the schema of DESIGN.md §4 and
checks every rule of `planner.trace.validate` on whole columns. It never
reports an error itself: whenever it cannot vouch for the file (a parse
error, a rule broken, a line it cannot map to one row: a blank line, a BOM,
leading whitespace, non-ASCII bytes, a line over MAX_LINE_BYTES), it returns
None and the strict reader reads the file again and names the line and the
field. So on a good file both readers return equal requests, and on a bad
one the error is the strict reader's.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from planner.trace.records import TraceRequest
from planner.trace.validate import MAX_ARRIVAL_S, MAX_TOKENS

SCHEMA = pa.schema(
    [
        ("arrival_s", pa.float64()),
        ("prompt_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("id", pa.string()),
        ("model", pa.string()),
        ("tenant", pa.string()),
        ("priority", pa.int64()),
        ("slo_ttft_s", pa.float64()),
        ("slo_tbt_s", pa.float64()),
        ("prefix_block_ids", pa.list_(pa.int64())),
    ]
)
_PARSE = pa_json.ParseOptions(
    explicit_schema=SCHEMA, newlines_in_values=False, unexpected_field_behavior="error"
)
_BLOCK_BYTES = 16 << 20
_NEWLINE = ord("\n")


def _one_object_per_line(data: bytes, max_line_bytes: int) -> int | None:
    """The number of lines when every line is `{...}` (optionally ending in
    \\r), ASCII only and at most max_line_bytes long; otherwise None."""
    raw = np.frombuffer(data, dtype=np.uint8)
    if raw.size == 0 or bool((raw >= 0x80).any()):
        return None
    ends = np.flatnonzero(raw == _NEWLINE)
    if ends.size == 0 or ends[-1] != raw.size - 1:
        ends = np.append(ends, raw.size)  # a last line without its newline
    starts = np.concatenate(([0], ends[:-1] + 1))
    if bool((ends - starts > max_line_bytes).any()) or bool((ends <= starts).any()):
        return None
    last = ends - 1
    last = np.where(raw[last] == ord("\r"), last - 1, last)
    if bool((last < starts).any()):
        return None
    if not (bool((raw[starts] == ord("{")).all()) and bool((raw[last] == ord("}")).all())):
        return None
    return int(ends.size)


def _finite_positive(column: pa.ChunkedArray) -> bool:
    values = column.drop_null().to_numpy()
    return bool(np.isfinite(values).all() and (values > 0).all())


def _valid(table: pa.Table, check_order: bool) -> bool:
    arrival = table["arrival_s"]
    prompt = table["prompt_tokens"]
    output = table["output_tokens"]
    if arrival.null_count or prompt.null_count or output.null_count:
        return False
    a = arrival.to_numpy()
    if not (np.isfinite(a).all() and (a >= 0).all() and (a <= MAX_ARRIVAL_S).all()):
        return False
    for counts in (prompt.to_numpy(), output.to_numpy()):
        if not ((counts >= 1).all() and (counts <= MAX_TOKENS).all()):
            return False
    if check_order and a.size > 1 and not bool((np.diff(a) >= 0).all()):
        return False
    for name in ("id", "model", "tenant"):
        column = table[name]
        if column.null_count < len(column) and pc.min(pc.utf8_length(column)).as_py() < 1:
            return False
    ids = table["id"].drop_null()
    if len(ids) and pc.count_distinct(ids).as_py() != len(ids):
        return False
    if not (_finite_positive(table["slo_ttft_s"]) and _finite_positive(table["slo_tbt_s"])):
        return False
    blocks = pc.list_flatten(table["prefix_block_ids"])
    return len(blocks) == 0 or (blocks.null_count == 0 and pc.min(blocks).as_py() >= 0)


# TraceRequest's fields in an unfrozen class of the same slot layout. A frozen
# dataclass sets each field through object.__setattr__, which for a million
# requests costs about a second; building the unfrozen twin and giving it
# TraceRequest's class (allowed between classes of identical slots) makes
# the same frozen objects in about half the time.
_Unfrozen = dataclasses.make_dataclass(
    "_Unfrozen",
    [
        (f.name, f.type, dataclasses.field(default=f.default))
        for f in dataclasses.fields(TraceRequest)
    ],
    slots=True,
)


def _frozen(request: object) -> TraceRequest:
    request.__class__ = TraceRequest
    return request  # type: ignore[return-value]


def _build(*columns: Iterable[object]) -> list[TraceRequest]:
    return list(map(_frozen, map(_Unfrozen, *columns)))


def _column(table: pa.Table, name: str) -> list[object]:
    column = table[name]
    if column.null_count == len(column):
        return [None] * len(column)
    return column.to_pylist()  # type: ignore[no-any-return]


def _requests(table: pa.Table) -> list[TraceRequest]:
    n = table.num_rows
    arrivals = table["arrival_s"].to_numpy().tolist()
    prompts = table["prompt_tokens"].to_numpy().tolist()
    outputs = table["output_tokens"].to_numpy().tolist()
    optional = ("id", "model", "tenant", "priority", "slo_ttft_s", "slo_tbt_s")
    if all(table[name].null_count == n for name in (*optional, "prefix_block_ids")):
        return _build(arrivals, prompts, outputs)
    blocks_column = table["prefix_block_ids"]
    blocks = (
        [()] * n
        if blocks_column.null_count == n
        else [() if b is None else tuple(b) for b in blocks_column.to_pylist()]
    )
    return _build(arrivals, prompts, outputs, *(_column(table, name) for name in optional), blocks)


def read_trace_columns(
    data: bytes, *, sort: bool, max_line_bytes: int
) -> list[TraceRequest] | None:
    """The requests of a trace file's bytes, or None where the strict reader
    must decide (see the module's docstring)."""
    lines = _one_object_per_line(data, max_line_bytes)
    if lines is None:
        return None
    try:
        table = pa_json.read_json(
            io.BytesIO(data),
            read_options=pa_json.ReadOptions(block_size=_BLOCK_BYTES),
            parse_options=_PARSE,
        )
    except (pa.ArrowException, ValueError):
        return None
    if table.num_rows != lines or not _valid(table, check_order=not sort):
        return None
    if sort:
        order = np.argsort(table["arrival_s"].to_numpy(), kind="stable")
        table = table.take(pa.array(order))
    return _requests(table)


__all__ = ["SCHEMA", "read_trace_columns"]
