"""Builders shared by the rotation policy tests (not a test module)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from planner.kernels.transfer_batch import CopyDirection

from planner.domain.requests import (
    BlockPools,
    RequestState,
    RequestTable,
    Slo,
    Snapshot,
    TrackedRequest,
)
from planner.domain.rotation import (
    MoveKind,
    RotationInputs,
    RotationParams,
    RotationPlan,
    RotationVariant,
)
from planner.policies.rotation import plan_rotation
from planner.profiles import HardwareProfile, ModelProfile

WAITING = RequestState.WAITING
RUNNING = RequestState.RUNNING
ROTARY = RequestState.ROTARY


def waiting(rid: str, arrival_s: float, prompt_blocks: int, **kw: Any) -> TrackedRequest:
    return TrackedRequest(rid, WAITING, arrival_s=arrival_s, prompt_blocks=prompt_blocks, **kw)


def running(rid: str, run_start_s: float, gpu_blocks: int = 0, **kw: Any) -> TrackedRequest:
    return TrackedRequest(rid, RUNNING, run_start_s=run_start_s, gpu_blocks=gpu_blocks, **kw)


def rotary(rid: str, last_token_s: float, cpu_blocks: int = 0, **kw: Any) -> TrackedRequest:
    return TrackedRequest(rid, ROTARY, last_token_s=last_token_s, cpu_blocks=cpu_blocks, **kw)


def make_snapshot(
    requests: Sequence[TrackedRequest],
    now_s: float,
    free_gpu_blocks: int | None = None,
    *,
    pools: BlockPools | None = None,
    free_cpu_blocks: int | None = None,
    last_iteration_s: float | None = None,
    block_size_tokens: int = 16,
    max_batched_tokens: int | None = None,
    max_running_requests: int | None = None,
) -> Snapshot:
    """Counts-level unless pools is given; at block level free_gpu_blocks
    defaults to the pool's size."""
    block_level = pools is not None
    if free_gpu_blocks is None:
        assert pools is not None
        free_gpu_blocks = len(pools.free_gpu_block_ids)
    return Snapshot(
        now_s=now_s,
        free_gpu_blocks=free_gpu_blocks,
        requests=RequestTable.from_requests(requests, block_size_tokens, block_level=block_level),
        block_size_tokens=block_size_tokens,
        free_cpu_blocks=free_cpu_blocks,
        last_iteration_s=last_iteration_s,
        pools=pools,
        max_batched_tokens=max_batched_tokens,
        max_running_requests=max_running_requests,
    )


def make_inputs(
    *,
    slo: Slo | None = None,
    model: ModelProfile | None = None,
    hardware: HardwareProfile | None = None,
    **params: Any,
) -> RotationInputs:
    """The paper's Algorithm 1 (RotationVariant.LVF_PAPER) unless params
    name a variant: most rotation tests pin Algorithm 1's exact plans."""
    params.setdefault("variant", RotationVariant.LVF_PAPER)
    return RotationInputs(
        params=RotationParams(**params),
        slo=slo if slo is not None else Slo(),
        model=model,
        hardware=hardware,
    )


def plan(
    requests: Sequence[TrackedRequest],
    now_s: float,
    free_gpu_blocks: int | None = None,
    *,
    pools: BlockPools | None = None,
    free_cpu_blocks: int | None = None,
    last_iteration_s: float | None = None,
    max_batched_tokens: int | None = None,
    max_running_requests: int | None = None,
    slo: Slo | None = None,
    model: ModelProfile | None = None,
    hardware: HardwareProfile | None = None,
    **params: Any,
) -> RotationPlan:
    snapshot = make_snapshot(
        requests,
        now_s,
        free_gpu_blocks,
        pools=pools,
        free_cpu_blocks=free_cpu_blocks,
        last_iteration_s=last_iteration_s,
        max_batched_tokens=max_batched_tokens,
        max_running_requests=max_running_requests,
    )
    return plan_rotation(snapshot, make_inputs(slo=slo, model=model, hardware=hardware, **params))


def ids(decisions: Sequence[Any]) -> list[str]:
    return [d.id for d in decisions]


def direction_of(kind: MoveKind) -> CopyDirection:
    return CopyDirection.H2D if kind == MoveKind.SWAP_IN else CopyDirection.D2H


def isclose(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)
