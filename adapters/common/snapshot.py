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


@dataclass(frozen=True, slots=True)
class PoolSizes:
    free_gpu_blocks: int
    block_size_tokens: int
    # None: the CPU pool is not a constraint.
    free_cpu_blocks: int | None = None


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """What the engine admits in one step (None: no limit)."""

    max_batched_tokens: int | None = None
    max_running_requests: int | None = None


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
    limits: EngineLimits | None = None,
) -> rotation_pb2.PlanRotationRequest:
    """Timestamps must be on the same clock as now_s and not later than it."""
    request = rotation_pb2.PlanRotationRequest()
    snap = request.snapshot
    snap.now_s = now_s
    snap.free_gpu_blocks = pools.free_gpu_blocks
    snap.block_size_tokens = pools.block_size_tokens
    if pools.free_cpu_blocks is not None:
        snap.free_cpu_blocks = pools.free_cpu_blocks
    if last_iteration_s is not None:
        snap.last_iteration_s = last_iteration_s
    if limits is not None and limits.max_batched_tokens is not None:
        snap.max_batched_tokens = limits.max_batched_tokens
    if limits is not None and limits.max_running_requests is not None:
        snap.max_running_requests = limits.max_running_requests
    if params is not None:
        request.params.CopyFrom(params)
    if slo is not None:
        request.slo.CopyFrom(slo)
    if profile is not None:
        request.profile.CopyFrom(profile)
    cols = snap.columns
    cols.SetInParent()
    size = pools.block_size_tokens
    for v in views:
        state = planner_state(v)
        cols.id.append(v.request_id)
        cols.state.append(state)
        cols.arrival_s.append(v.arrival_s)
        cols.run_start_s.append(_or_nan(v.run_start_s))
        cols.last_token_s.append(_last_token_s(v, state))
        if state == common_pb2.WAITING:
            # The planner adds the first decode block itself.
            cols.prompt_blocks.append(blocks_for(v.prompt_tokens + v.output_tokens, size))
        else:
            cols.prompt_blocks.append(0)
        cols.gpu_blocks.append(v.gpu_blocks if state == common_pb2.RUNNING else 0)
        cols.cpu_blocks.append(blocks_to_resume(v, size) if state == common_pb2.ROTARY else 0)
        cols.num_tokens.append(v.computed_tokens if state == common_pb2.RUNNING else 0)
        cols.synced_blocks.append(0)
        cols.slo_ttft_s.append(v.slo_ttft_s)
        cols.slo_tbt_s.append(v.slo_tbt_s)
    return request


def _or_nan(t: float | None) -> float:
    return math.nan if t is None else t


def _last_token_s(view: EngineRequestView, state: common_pb2.RequestState.ValueType) -> float:
    if view.last_token_s is not None:
        return view.last_token_s
    # A ROTARY request needs one; an engine that lost it gets the arrival.
    return view.arrival_s if state == common_pb2.ROTARY else math.nan
