"""Engine-neutral snapshot building: plain records of what the engine holds
for each request, turned into one PlanRotationRequest (counts-only, packed
columns). Engine adapters fill the records from their own structures."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

from planner.v1 import common_pb2, rotation_pb2


class ViewState(enum.Enum):
    # Not started, or started but its KV was dropped before any output.
    WAITING = "waiting"
    RUNNING = "running"
    # Preempted by recompute: KV dropped, it has output tokens.
    PREEMPTED = "preempted"
    # Preempted with its KV swapped out to CPU memory.
    SWAPPED = "swapped"


@dataclass(frozen=True, slots=True)
class EngineRequestView:
    request_id: str
    state: ViewState
    prompt_tokens: int
    computed_tokens: int
    output_tokens: int
    gpu_blocks: int
    cpu_blocks: int
    arrival_s: float
    # When it last entered the running state; None if it never did.
    run_start_s: float | None = None
    # When it produced its latest token; None before the first one.
    last_token_s: float | None = None
    # 0: the snapshot-wide SLO applies.
    slo_ttft_s: float = 0.0
    slo_tbt_s: float = 0.0
    # When it produced its first token; None before it (or unknown). With
    # output_tokens, the planner's measure of its TPOT slack: rotation never
    # preempts a request whose slack it cannot tell.
    first_token_s: float | None = None


@dataclass(frozen=True, slots=True)
class PoolSizes:
    free_gpu_blocks: int
    block_size_tokens: int
    # None: the CPU pool is not a constraint.
    free_cpu_blocks: int | None = None


def blocks_for(tokens: int, block_size_tokens: int) -> int:
    return -(-tokens // block_size_tokens)


def planner_state(view: EngineRequestView) -> common_pb2.RequestState.ValueType:
    """WAITING and RUNNING as they are; a preempted or swapped request with
    output is ROTARY (its lag grows from its last token); without output it
    is WAITING again (its lag grows from its arrival)."""
    if view.state is ViewState.RUNNING:
        return common_pb2.RUNNING
    if view.state is ViewState.WAITING or view.output_tokens == 0:
        return common_pb2.WAITING
    return common_pb2.ROTARY


def blocks_to_resume(view: EngineRequestView, block_size_tokens: int) -> int:
    """GPU blocks a non-running request takes when it is brought back: its
    swapped blocks, or what recomputing its tokens (+1 for the next) needs."""
    if view.state is ViewState.SWAPPED and view.cpu_blocks > 0:
        return view.cpu_blocks
    return blocks_for(view.prompt_tokens + view.output_tokens + 1, block_size_tokens)


def build_rotation_request(
    views: Sequence[EngineRequestView],
    pools: PoolSizes,
    now_s: float,
    *,
    last_iteration_s: float | None = None,
    params: rotation_pb2.RotationParams | None = None,
    slo: common_pb2.Slo | None = None,
    profile: common_pb2.EngineProfile | None = None,
    max_batched_tokens: int | None = None,
    max_running_requests: int | None = None,
) -> rotation_pb2.PlanRotationRequest:
    """Timestamps must be on the same clock as now_s and not later than it.
    max_batched_tokens, max_running_requests: the engine's per-iteration
    token budget and running cap, so that rotation does not prioritize
    waiting requests the engine could not start this iteration."""
    request = rotation_pb2.PlanRotationRequest()
    snap = request.snapshot
    snap.now_s = now_s
    snap.free_gpu_blocks = pools.free_gpu_blocks
    snap.block_size_tokens = pools.block_size_tokens
    if pools.free_cpu_blocks is not None:
        snap.free_cpu_blocks = pools.free_cpu_blocks
    if last_iteration_s is not None:
        snap.last_iteration_s = last_iteration_s
    if max_batched_tokens is not None:
        snap.max_batched_tokens = max_batched_tokens
    if max_running_requests is not None:
        snap.max_running_requests = max_running_requests
    if params is not None:
        request.params.CopyFrom(params)
    if slo is not None:
        request.slo.CopyFrom(slo)
    if profile is not None:
        request.profile.CopyFrom(profile)
    cols = snap.columns
    cols.SetInParent()
    size = pools.block_size_tokens
    states = [planner_state(v) for v in views]
    # One extend per column: appending element by element to a repeated
    # field costs about ten times as much (6 ms at 1,000 requests).
    cols.id.extend([v.request_id for v in views])
    cols.state.extend(states)
    cols.arrival_s.extend([v.arrival_s for v in views])
    cols.run_start_s.extend([_or_nan(v.run_start_s) for v in views])
    cols.last_token_s.extend([_last_token_s(v, s) for v, s in zip(views, states, strict=True)])
    # A WAITING request's prompt blocks; the planner adds the first decode
    # block itself.
    cols.prompt_blocks.extend(
        [
            blocks_for(v.prompt_tokens + v.output_tokens, size) if s == common_pb2.WAITING else 0
            for v, s in zip(views, states, strict=True)
        ]
    )
    cols.gpu_blocks.extend(
        [v.gpu_blocks if s == common_pb2.RUNNING else 0 for v, s in zip(views, states, strict=True)]
    )
    cols.cpu_blocks.extend(
        [
            blocks_to_resume(v, size) if s == common_pb2.ROTARY else 0
            for v, s in zip(views, states, strict=True)
        ]
    )
    cols.num_tokens.extend(
        [
            v.computed_tokens if s == common_pb2.RUNNING else 0
            for v, s in zip(views, states, strict=True)
        ]
    )
    cols.synced_blocks.extend([0] * len(views))
    cols.slo_ttft_s.extend([v.slo_ttft_s for v in views])
    cols.slo_tbt_s.extend([v.slo_tbt_s for v in views])
    # The tokens still to compute are prefill_tokens - num_tokens: the
    # prompt and any output a recompute redoes, or one decode.
    cols.prefill_tokens.extend([v.prompt_tokens + v.output_tokens for v in views])
    cols.output_tokens.extend([v.output_tokens for v in views])
    cols.first_token_s.extend([_or_nan(v.first_token_s) for v in views])
    return request


def _or_nan(t: float | None) -> float:
    return math.nan if t is None else t


def _last_token_s(view: EngineRequestView, state: common_pb2.RequestState.ValueType) -> float:
    if view.last_token_s is not None:
        return view.last_token_s
    # A ROTARY request needs one; an engine that lost it gets the arrival.
    return view.arrival_s if state == common_pb2.ROTARY else math.nan
