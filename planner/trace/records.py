"""One request of a trace, as `planner replay` reads it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """A JSON-lines record: arrival_s, prompt_tokens and output_tokens are
    required; the rest optional. Times in seconds from the trace's start."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    id: str | None = None
    model: str | None = None
    tenant: str | None = None
    priority: int | None = None
    slo_ttft_s: float | None = None
    slo_tbt_s: float | None = None
    # One id per prefix block (Mooncake: 512-token blocks); equal ids mark a
    # shared prefix.
    prefix_block_ids: tuple[int, ...] = ()
