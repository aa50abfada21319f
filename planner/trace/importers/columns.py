"""The columnar side of a conversion: a source read whole into arrays
(pyarrow), ordered, windowed, stamped and written as JSON lines without a
Python object per request.

A converter may offer `read_columns`; it returns None whenever it cannot
vouch for the source (anything its strict `read` might refuse or treat
differently), and the conversion then goes the strict way, which names the
bad line. The same holds for the output: a request the trace rules would
refuse sends the conversion the strict way too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from planner.trace.importers.base import ImportOptions, ImportSummary, Int64s, SourceColumns
from planner.trace.stamp import Stamp
from planner.trace.validate import MAX_ARRIVAL_S, MAX_TOKENS


def clamp_zeros(counts: Int64s, summary: ImportSummary, what: str) -> Int64s:
    """at_least_one on a whole column."""
    zeros = int(np.count_nonzero(counts == 0))
    if zeros:
        summary.changed[f"{what} 0 set to 1"] += zeros
        return np.maximum(counts, 1)
    return counts


@dataclass(frozen=True, slots=True)
class TraceColumns:
    """The requests to write: arrival_s in seconds from the window's start."""

    arrival_s: npt.NDArray[np.float64]
    prompt_tokens: Int64s
    output_tokens: Int64s

    def __len__(self) -> int:
        return int(self.arrival_s.size)

    def valid(self) -> bool:
        a = self.arrival_s
        return bool(
            np.isfinite(a).all()
            and (a >= 0).all()
            and (a <= MAX_ARRIVAL_S).all()
            and (self.prompt_tokens <= MAX_TOKENS).all()
            and (self.output_tokens <= MAX_TOKENS).all()
        )


def order_and_window(
    source: SourceColumns, options: ImportOptions, summary: ImportSummary
) -> TraceColumns:
    """pipeline's _ordered and _windowed on columns (same rules, same notes)."""
    time_ns = source.time_ns
    prompt, output = source.prompt_tokens, source.output_tokens
    out_of_order = int(np.count_nonzero(np.diff(time_ns) < 0))
    if out_of_order:
        order = np.argsort(time_ns, kind="stable")
        time_ns, prompt, output = time_ns[order], prompt[order], output[order]
        summary.notes.append(f"{out_of_order} rows were earlier than the row before them; sorted")
    offset_ns = time_ns - time_ns[0]
    start_ns = round((options.start_s or 0.0) * 1e9)
    inside = offset_ns >= start_ns
    if options.duration_s is not None:
        inside &= offset_ns < start_ns + round(options.duration_s * 1e9)
    summary.outside_window += int(inside.size - np.count_nonzero(inside))
    keep = np.flatnonzero(inside)
    if options.limit is not None and keep.size > options.limit:
        summary.over_limit += int(keep.size - options.limit)
        keep = keep[: options.limit]
    return TraceColumns(
        arrival_s=(offset_ns[keep] - start_ns) / 1e9,
        prompt_tokens=prompt[keep],
        output_tokens=output[keep],
    )


def json_lines(columns: TraceColumns, stamp: Stamp) -> Iterator[str]:
    """The JSON lines of `columns` with `stamp`'s fields, as write_trace
    would write them (fields in the order of validate.FIELDS)."""
    model = f', "model": {json.dumps(stamp.model)}' if stamp.model is not None else ""
    tenant = f', "tenant": {json.dumps(stamp.tenant)}' if stamp.tenant is not None else ""
    slos = "".join(
        f', "{name}": {value!r}'
        for name, value in (("slo_ttft_s", stamp.slo_ttft_s), ("slo_tbt_s", stamp.slo_tbt_s))
        if value is not None
    )
    rows = zip(
        columns.arrival_s.tolist(),
        columns.prompt_tokens.tolist(),
        columns.output_tokens.tolist(),
        strict=True,
    )
    if stamp.id_prefix is None:
        tail = model + tenant + slos + "}"
        for a, p, o in rows:
            yield f'{{"arrival_s": {a!r}, "prompt_tokens": {p}, "output_tokens": {o}{tail}'
    else:
        prefix = json.dumps(stamp.id_prefix)[:-1]  # the quoted prefix, left open
        tail = model + tenant + slos + "}"
        for index, (a, p, o) in enumerate(rows):
            yield (
                f'{{"arrival_s": {a!r}, "prompt_tokens": {p}, "output_tokens": {o}, '
                f'"id": {prefix}{index}"{tail}'
            )
