"""Vidur's request-trace CSV (what its trace-replay request generator reads):
arrived_at (seconds), num_prefill_tokens, num_decode_tokens, one row per
request in arrival order. Keeps arrivals and lengths exactly (arrivals as
the shortest decimal that reads back as the same float); everything else
has no column. `planner trace import --format vidur` reads it back, with the
first arrival moved to 0."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from planner.trace.exporters.base import Exporter
from planner.trace.records import TraceRequest


def _rows(requests: Sequence[TraceRequest]) -> Iterator[Sequence[object]]:
    for r in requests:
        yield (repr(r.arrival_s), r.prompt_tokens, r.output_tokens)


EXPORTER = Exporter(
    name="vidur",
    help="Vidur trace CSV (arrived_at, num_prefill_tokens, num_decode_tokens) for its "
    "trace-replay request generator",
    header=("arrived_at", "num_prefill_tokens", "num_decode_tokens"),
    rows=_rows,
    kept=(),
    notes=(
        "Vidur scales arrived_at by its time_scale_factor and may cut prompts so that "
        "prompt + output <= its max_tokens",
    ),
)
