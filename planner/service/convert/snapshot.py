"""Snapshot: the engine's view of its requests, validated field by field."""

from __future__ import annotations

import math

from planner.domain.requests import (
    DEFAULT_BLOCK_SIZE_TOKENS,
    NO_BLOCK,
    BlockPools,
    RequestState,
    RequestTableBuilder,
    Snapshot,
)
from planner.service.convert.checks import block_count, block_ids, finite, positive
from planner.service.errors import InvalidArgumentError
from planner.service.limits import MAX_BLOCK_SIZE_TOKENS, MAX_ID_LENGTH, ServiceLimits
from planner.v1 import common_pb2

_STATES = {int(s) for s in RequestState}
# The timestamp each state's VLT is computed from.
_REQUIRED_TIME = {
    RequestState.WAITING: "arrival_s",
    RequestState.RUNNING: "run_start_s",
    RequestState.ROTARY: "last_token_s",
}


def snapshot_from_proto(
    field: str, msg: common_pb2.Snapshot, limits: ServiceLimits, has: bool
) -> Snapshot:
    """has: whether the field was set at all (a snapshot is required)."""
    if not has:
        raise InvalidArgumentError(field, "required")
    now_s = finite(f"{field}.now_s", msg.now_s)
    block_size = DEFAULT_BLOCK_SIZE_TOKENS
    if msg.HasField("block_size_tokens"):
        block_size = msg.block_size_tokens
        if not 0 < block_size <= MAX_BLOCK_SIZE_TOKENS:
            raise InvalidArgumentError(
                f"{field}.block_size_tokens",
                f"must be in [1, {MAX_BLOCK_SIZE_TOKENS}], got {block_size}",
            )
    if len(msg.requests) > limits.max_requests_per_snapshot:
        raise InvalidArgumentError(
            f"{field}.requests",
            f"{len(msg.requests)} requests exceed the limit of "
            f"{limits.max_requests_per_snapshot} per snapshot",
        )
    block_level = msg.HasField("pools")
    free_gpu = block_count(f"{field}.free_gpu_blocks", msg.free_gpu_blocks)
    free_cpu = (
        block_count(f"{field}.free_cpu_blocks", msg.free_cpu_blocks)
        if msg.HasField("free_cpu_blocks")
        else None
    )
    last_iteration = (
        positive(f"{field}.last_iteration_s", msg.last_iteration_s)
        if msg.HasField("last_iteration_s")
        else None
    )
    pools = None
    if block_level:
        pools, free_gpu, free_cpu = _pools(f"{field}.pools", msg, free_gpu, free_cpu, limits)
    builder = RequestTableBuilder(block_size, block_level)
    seen: dict[str, int] = {}
    for i, r in enumerate(msg.requests):
        _add_request(
            f"{field}.requests[{i}]",
            r,
            now_s=now_s,
            block_size=block_size,
            block_level=block_level,
            seen=seen,
            builder=builder,
        )
        seen[r.id] = i
    snapshot = Snapshot(
        now_s=now_s,
        free_gpu_blocks=free_gpu,
        requests=builder.build(),
        block_size_tokens=block_size,
        free_cpu_blocks=free_cpu,
        last_iteration_s=last_iteration,
        pools=pools,
    )
    if block_level:
        _check_block_ids_disjoint(field, msg, limits)
    return snapshot


def _pools(
    field: str,
    msg: common_pb2.Snapshot,
    free_gpu: int,
    free_cpu: int | None,
    limits: ServiceLimits,
) -> tuple[BlockPools, int, int]:
    gpu_ids = block_ids(f"{field}.free_gpu_block_ids", tuple(msg.pools.free_gpu_block_ids))
    cpu_ids = block_ids(f"{field}.free_cpu_block_ids", tuple(msg.pools.free_cpu_block_ids))
    if len(gpu_ids) + len(cpu_ids) > limits.max_block_ids_per_snapshot:
        raise InvalidArgumentError(field, "more block ids than the per-snapshot limit")
    if free_gpu not in (0, len(gpu_ids)):
        raise InvalidArgumentError(
            "snapshot.free_gpu_blocks",
            f"{free_gpu} disagrees with {len(gpu_ids)} ids in {field}.free_gpu_block_ids",
        )
    if free_cpu is not None and free_cpu != len(cpu_ids):
        raise InvalidArgumentError(
            "snapshot.free_cpu_blocks",
            f"{free_cpu} disagrees with {len(cpu_ids)} ids in {field}.free_cpu_block_ids",
        )
    return BlockPools(gpu_ids, cpu_ids), len(gpu_ids), len(cpu_ids)


def _add_request(
    field: str,
    r: common_pb2.TrackedRequest,
    *,
    now_s: float,
    block_size: int,
    block_level: bool,
    seen: dict[str, int],
    builder: RequestTableBuilder,
) -> None:
    if not r.id:
        raise InvalidArgumentError(f"{field}.id", "required (a non-empty string)")
    if len(r.id) > MAX_ID_LENGTH:
        raise InvalidArgumentError(f"{field}.id", f"longer than {MAX_ID_LENGTH} characters")
    if r.id in seen:
        raise InvalidArgumentError(
            f"{field}.id", f"duplicate id {r.id!r} (also snapshot.requests[{seen[r.id]}])"
        )
    if r.state not in _STATES:
        names = ", ".join(s.name for s in RequestState)
        raise InvalidArgumentError(f"{field}.state", f"must be one of {names}, got {r.state}")
    state = RequestState(r.state)
    times = {}
    for name in ("arrival_s", "run_start_s", "last_token_s"):
        if r.HasField(name):
            value = finite(f"{field}.{name}", getattr(r, name))
            if value > now_s:
                raise InvalidArgumentError(
                    f"{field}.{name}", f"{value} is after snapshot.now_s {now_s}"
                )
            times[name] = value
    required = _REQUIRED_TIME[state]
    if required not in times:
        raise InvalidArgumentError(f"{field}.{required}", f"required for a {state.name} request")
    prompt = block_count(f"{field}.prompt_blocks", r.prompt_blocks)
    if state == RequestState.WAITING and prompt == 0:
        raise InvalidArgumentError(f"{field}.prompt_blocks", "a WAITING request needs >= 1 block")
    gpu = block_count(f"{field}.gpu_blocks", r.gpu_blocks)
    cpu = block_count(f"{field}.cpu_blocks", r.cpu_blocks)
    synced = block_count(f"{field}.synced_blocks", r.synced_blocks)
    num_tokens = None
    if r.HasField("num_tokens"):
        num_tokens = block_count(f"{field}.num_tokens", r.num_tokens)
    if synced > gpu:
        raise InvalidArgumentError(f"{field}.synced_blocks", f"{synced} exceeds gpu_blocks {gpu}")
    slo_ttft = slo_tbt = None
    if r.HasField("slo"):
        if r.slo.HasField("ttft_s"):
            slo_ttft = positive(f"{field}.slo.ttft_s", r.slo.ttft_s)
        if r.slo.HasField("tbt_s"):
            slo_tbt = positive(f"{field}.slo.tbt_s", r.slo.tbt_s)
    gpu_ids: tuple[int, ...] = ()
    cpu_ids: tuple[int, ...] = ()
    if block_level:
        gpu_ids, cpu_ids = _request_block_ids(
            field, r, state=state, gpu=gpu, cpu=cpu, num_tokens=num_tokens, block_size=block_size
        )
    elif r.gpu_block_ids or r.cpu_block_ids:
        name = "gpu_block_ids" if r.gpu_block_ids else "cpu_block_ids"
        raise InvalidArgumentError(f"{field}.{name}", "block ids need snapshot.pools to be set")
    builder.add(
        r.id,
        state,
        arrival_s=times.get("arrival_s", math.nan),
        run_start_s=times.get("run_start_s", math.nan),
        last_token_s=times.get("last_token_s", math.nan),
        prompt_blocks=prompt,
        gpu_blocks=gpu,
        cpu_blocks=cpu,
        num_tokens=num_tokens,
        synced_blocks=synced,
        slo_ttft_s=slo_ttft,
        slo_tbt_s=slo_tbt,
        gpu_block_ids=gpu_ids,
        cpu_block_ids=cpu_ids,
    )


def _request_block_ids(
    field: str,
    r: common_pb2.TrackedRequest,
    *,
    state: RequestState,
    gpu: int,
    cpu: int,
    num_tokens: int | None,
    block_size: int,
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    gpu_ids = block_ids(f"{field}.gpu_block_ids", tuple(r.gpu_block_ids))
    cpu_ids = block_ids(
        f"{field}.cpu_block_ids", tuple(r.cpu_block_ids), allow_none=state == RequestState.RUNNING
    )
    if state == RequestState.WAITING and (gpu_ids or cpu_ids):
        name = "gpu_block_ids" if gpu_ids else "cpu_block_ids"
        raise InvalidArgumentError(f"{field}.{name}", "a WAITING request holds no blocks")
    if state == RequestState.ROTARY:
        if gpu_ids:
            raise InvalidArgumentError(
                f"{field}.gpu_block_ids", "a ROTARY request holds no GPU blocks"
            )
        if cpu not in (0, len(cpu_ids)):
            raise InvalidArgumentError(
                f"{field}.cpu_blocks", f"{cpu} disagrees with {len(cpu_ids)} cpu_block_ids"
            )
    if state == RequestState.RUNNING:
        if gpu not in (0, len(gpu_ids)):
            raise InvalidArgumentError(
                f"{field}.gpu_blocks", f"{gpu} disagrees with {len(gpu_ids)} gpu_block_ids"
            )
        if len(cpu_ids) > len(gpu_ids):
            raise InvalidArgumentError(
                f"{field}.cpu_block_ids",
                f"{len(cpu_ids)} entries for {len(gpu_ids)} GPU blocks",
            )
        full = (
            max(len(gpu_ids) - 1, 0)
            if num_tokens is None
            else min(num_tokens // block_size, len(gpu_ids))
        )
        for i, b in enumerate(cpu_ids):
            if b != NO_BLOCK and i >= full:
                raise InvalidArgumentError(
                    f"{field}.cpu_block_ids[{i}]",
                    f"logical block {i} is not full ({full} full blocks), so it cannot "
                    "have a SYNCED CPU copy",
                )
    return gpu_ids, cpu_ids


def _check_block_ids_disjoint(field: str, msg: common_pb2.Snapshot, limits: ServiceLimits) -> None:
    """Each GPU block and each CPU block belongs to one owner at most."""
    for pool, free_name, req_name in (
        ("GPU", "free_gpu_block_ids", "gpu_block_ids"),
        ("CPU", "free_cpu_block_ids", "cpu_block_ids"),
    ):
        owner: dict[int, str] = {}
        total = 0
        sources = [(f"{field}.pools.{free_name}", getattr(msg.pools, free_name))]
        sources += [
            (f"{field}.requests[{i}].{req_name}", getattr(r, req_name))
            for i, r in enumerate(msg.requests)
        ]
        for path, ids in sources:
            total += len(ids)
            if total > limits.max_block_ids_per_snapshot:
                raise InvalidArgumentError(field, "more block ids than the per-snapshot limit")
            for j, b in enumerate(ids):
                if b == NO_BLOCK:
                    continue
                if b in owner:
                    raise InvalidArgumentError(
                        f"{path}[{j}]", f"{pool} block {b} is also in {owner[b]}"
                    )
                owner[b] = path
