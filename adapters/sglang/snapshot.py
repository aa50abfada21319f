"""SGLang scheduler state → the engine-neutral request views of
``planner.adapters.common.snapshot``.

SGLang counts KV in tokens and allocates it in pages of ``page_size`` tokens;
a page is the planner's block. Requests in the running batch are RUNNING.
A waiting request with output was retracted: SGLang recomputes it, so it is
PREEMPTED (SWAPPED when this plugin holds its KV in the host pool). SGLang's
time stamps are ``time.perf_counter()`` values with 0.0 meaning "not yet";
``now_s`` must come from the same clock."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..common.snapshot import (
    EngineRequestView,
    PoolSizes,
    ViewState,
    blocks_for,
)
from .engine_types import Req, Scheduler


def _stamp(value: float, now_s: float) -> float | None:
    """None when unset; never after ``now_s`` (one late stamp would make the
    planner reject the whole snapshot)."""
    return min(value, now_s) if value > 0.0 else None


def request_view(
    req: Req, running: bool, page_size: int, now_s: float, host_blocks: int = 0
) -> EngineRequestView:
    stats = req.time_stats
    prompt = len(req.origin_input_ids)
    output = len(req.output_ids)
    if running:
        state = ViewState.RUNNING
    elif output == 0:
        state = ViewState.WAITING
    else:
        state = ViewState.SWAPPED if host_blocks > 0 else ViewState.PREEMPTED
    return EngineRequestView(
        request_id=req.rid,
        state=state,
        prompt_tokens=prompt,
        computed_tokens=prompt + output if running else 0,
        output_tokens=output,
        gpu_blocks=blocks_for(prompt + output, page_size) if running else 0,
        cpu_blocks=host_blocks,
        arrival_s=_stamp(stats.wait_queue_entry_time, now_s) or now_s,
        run_start_s=_stamp(stats.forward_entry_time, now_s),
        last_token_s=_stamp(stats.last_decode_finish_time, now_s),
        first_token_s=_stamp(stats.prefill_finished_time, now_s) if output else None,
    )


def request_views(
    running: Sequence[Req],
    waiting: Sequence[Req],
    page_size: int,
    now_s: float,
    host_blocks: Mapping[str, int] | None = None,
) -> list[EngineRequestView]:
    """One view per request id (SGLang keeps a request in one place at a
    time; if one shows up twice the running entry wins)."""
    if page_size <= 0:
        raise ValueError(f"page_size must be > 0, got {page_size}")
    swapped = host_blocks or {}
    views: dict[str, EngineRequestView] = {}
    for req in running:
        views.setdefault(req.rid, request_view(req, True, page_size, now_s))
    for req in waiting:
        views.setdefault(
            req.rid, request_view(req, False, page_size, now_s, swapped.get(req.rid, 0))
        )
    return list(views.values())


def pool_sizes(scheduler: Scheduler) -> PoolSizes:
    page = scheduler.page_size
    free_tokens = max(scheduler.token_to_kv_pool_allocator.available_size(), 0)
    return PoolSizes(free_gpu_blocks=free_tokens // page, block_size_tokens=page)
