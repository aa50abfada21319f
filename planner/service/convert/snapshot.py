"""Snapshot: the engine's view of its requests, validated field by field.

The common path is columnar: one C-level attribute fetch per request, then
vectorized checks. Only rows the vectorized checks flag are validated one by
one, which is where the error naming the field comes from, so a snapshot of
thousands of requests converts in well under a millisecond per thousand.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from planner.domain.requests import (
    DEFAULT_BLOCK_SIZE_TOKENS,
    NO_BLOCK,
    BlockPools,
    RequestState,
    Snapshot,
    table_from_columns,
)
from planner.service.convert.checks import at_most, block_count, block_ids, finite
from planner.service.convert.common import MAX_SLO_S
from planner.service.errors import InvalidArgumentError
from planner.service.limits import (
    MAX_BLOCK_SIZE_TOKENS,
    MAX_BLOCKS,
    MAX_ID_LENGTH,
    ServiceLimits,
)
from planner.v1 import common_pb2

TIME_FIELDS = ("arrival_s", "run_start_s", "last_token_s", "first_token_s")
COUNT_FIELDS = (
    "prompt_blocks",
    "gpu_blocks",
    "cpu_blocks",
    "num_tokens",
    "synced_blocks",
    "prefill_tokens",
    "output_tokens",
)
SLO_FIELDS = ("slo_ttft_s", "slo_tbt_s")
# A time more than ~30,000 years from zero is a unit mistake (nanoseconds
# for seconds). Bounding the times, the SLOs (MAX_SLO_S) and the rotation
# parameters keeps every term of a VLT a finite float.
MAX_TIME_S = 1e12
_ROW = operator.attrgetter("id", "state", *TIME_FIELDS, *COUNT_FIELDS, *SLO_FIELDS)
_VALUE_FIELDS = ("id", "state", *COUNT_FIELDS, *SLO_FIELDS)
_STATES = {int(s) for s in RequestState}
# The timestamp each state's VLT is computed from.
_REQUIRED_TIME = {
    RequestState.WAITING: "arrival_s",
    RequestState.RUNNING: "run_start_s",
    RequestState.ROTARY: "last_token_s",
}

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def snapshot_from_proto(
    field: str, msg: common_pb2.Snapshot, limits: ServiceLimits, has: bool
) -> Snapshot:
    """has: whether the field was set at all (a snapshot is required)."""
    if not has:
        raise InvalidArgumentError(field, "required")
    now_s = _time(f"{field}.now_s", msg.now_s)
    block_size = DEFAULT_BLOCK_SIZE_TOKENS
    if msg.HasField("block_size_tokens"):
        block_size = msg.block_size_tokens
        if not 0 < block_size <= MAX_BLOCK_SIZE_TOKENS:
            raise InvalidArgumentError(
                f"{field}.block_size_tokens",
                f"must be in [1, {MAX_BLOCK_SIZE_TOKENS}], got {block_size}",
            )
    requests = msg.requests
    n = len(requests)
    if n > limits.max_requests_per_snapshot:
        raise InvalidArgumentError(
            f"{field}.requests",
            f"{n} requests exceed the limit of {limits.max_requests_per_snapshot} per snapshot",
        )
    free_gpu = block_count(f"{field}.free_gpu_blocks", msg.free_gpu_blocks)
    free_cpu = (
        block_count(f"{field}.free_cpu_blocks", msg.free_cpu_blocks)
        if msg.HasField("free_cpu_blocks")
        else None
    )
    last_iteration = None
    if msg.HasField("last_iteration_s"):
        last_iteration = finite(f"{field}.last_iteration_s", msg.last_iteration_s)
        if last_iteration <= 0:
            raise InvalidArgumentError(
                f"{field}.last_iteration_s", f"must be > 0, got {last_iteration}"
            )
    block_level = msg.HasField("pools")
    pools = None
    if block_level:
        pools, free_gpu, free_cpu = _pools(f"{field}.pools", msg, free_gpu, free_cpu, limits)

    if n and msg.HasField("columns"):
        raise InvalidArgumentError(f"{field}.columns", "set requests or columns, not both")
    if msg.HasField("columns"):
        if block_level:
            raise InvalidArgumentError(
                f"{field}.columns", "block-level snapshots (pools set) send requests as rows"
            )
        rows = _columns(f"{field}.columns", msg.columns, limits)
    else:
        rows = _rows(field, requests)
    suspect = _suspect_rows(rows, now_s, block_level)
    for i in np.flatnonzero(suspect).tolist():
        _validate_row(rows.values(i), functools.partial(rows.path, i), now_s, block_level)
    _check_unique_ids(rows)

    gpu_ids = cpu_ids = None
    if block_level:
        gpu_ids = [tuple(r.gpu_block_ids) for r in requests]
        cpu_ids = [tuple(r.cpu_block_ids) for r in requests]
        for i, r in enumerate(requests):
            _check_request_block_ids(
                f"{field}.requests[{i}]", r, gpu_ids[i], cpu_ids[i], block_size
            )
        assert pools is not None
        _check_block_ids_disjoint(field, pools, gpu_ids, cpu_ids, limits)
    elif n:
        for name in ("gpu_block_ids", "cpu_block_ids"):
            sizes = map(len, map(operator.attrgetter(name), requests))
            if any(sizes):
                i = next(i for i, r in enumerate(requests) if len(getattr(r, name)))
                raise InvalidArgumentError(
                    f"{field}.requests[{i}].{name}", "block ids need snapshot.pools to be set"
                )

    counts = rows.counts
    num_tokens = counts[3].astype(np.int64)
    prefill_tokens = counts[5].astype(np.int64)
    table = table_from_columns(
        rows.ids,
        state=rows.state.astype(np.int8),
        arrival_s=rows.times[0],
        run_start_s=rows.times[1],
        last_token_s=rows.times[2],
        prompt_blocks=counts[0].astype(np.int64),
        gpu_blocks=counts[1].astype(np.int64),
        cpu_blocks=counts[2].astype(np.int64),
        num_tokens=np.where(num_tokens == 0, -1, num_tokens),
        synced_blocks=counts[4].astype(np.int64),
        slo_ttft_s=np.where(rows.slo[0] == 0.0, math.nan, rows.slo[0]),
        slo_tbt_s=np.where(rows.slo[1] == 0.0, math.nan, rows.slo[1]),
        block_size_tokens=block_size,
        gpu_block_ids=gpu_ids,
        cpu_block_ids=cpu_ids,
        prefill_tokens=np.where(prefill_tokens == 0, -1, prefill_tokens),
        output_tokens=counts[6].astype(np.int64),
        first_token_s=rows.times[3],
    )
    return Snapshot(
        now_s=now_s,
        free_gpu_blocks=free_gpu,
        requests=table,
        block_size_tokens=block_size,
        free_cpu_blocks=free_cpu,
        last_iteration_s=last_iteration,
        pools=pools,
        max_batched_tokens=_engine_limit(field, msg, "max_batched_tokens"),
        max_running_requests=_engine_limit(field, msg, "max_running_requests"),
    )


def _engine_limit(field: str, msg: common_pb2.Snapshot, name: str) -> int | None:
    if not msg.HasField(name):  # type: ignore[arg-type]
        return None
    value = int(getattr(msg, name))
    if value < 1:
        raise InvalidArgumentError(f"{field}.{name}", f"must be >= 1, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class _Rows:
    """Request fields as columns, whichever encoding they came in.

    times: NaN where absent; bad_times: a time given but not a finite number.
    """

    ids: list[str]
    state: IntArray
    times: list[FloatArray]
    bad_times: list[npt.NDArray[np.bool_]]
    counts: list[FloatArray]
    slo: list[FloatArray]
    path: Callable[[int, str], str]
    values: Callable[[int], dict[str, Any]]


def _rows(field: str, requests: Any) -> _Rows:
    n = len(requests)
    columns = list(zip(*map(_ROW, requests), strict=True)) if n else [()] * 15
    raw_times = [np.array(c, dtype=np.float64) for c in columns[2:6]]
    state = np.array(columns[1], dtype=np.int64)
    # arrival_s matters for every row (tie-breaks); the others only for the
    # states that read them, so a 0.0 elsewhere is taken as absent unchecked.
    matters = [
        np.ones(n, dtype=np.bool_),
        state == int(RequestState.RUNNING),
        state == int(RequestState.ROTARY),
        state != int(RequestState.WAITING),
    ]
    times = [
        _absent_as_nan(requests, name, t, m)
        for name, t, m in zip(TIME_FIELDS, raw_times, matters, strict=True)
    ]

    def values(i: int) -> dict[str, Any]:
        r = requests[i]
        row: dict[str, Any] = {name: getattr(r, name) for name in _VALUE_FIELDS}
        for name in TIME_FIELDS:
            row[name] = getattr(r, name) if r.HasField(name) else None
        return row

    return _Rows(
        ids=list(columns[0]),
        state=state,
        times=times,
        bad_times=[~np.isfinite(t) for t in raw_times],
        counts=[np.array(c, dtype=np.float64) for c in columns[6:13]],
        slo=[np.array(c, dtype=np.float64) for c in columns[13:15]],
        path=lambda i, name: f"{field}.requests[{i}].{name}",
        values=values,
    )


def _columns(field: str, msg: common_pb2.RequestColumns, limits: ServiceLimits) -> _Rows:
    ids = list(msg.id)
    n = len(ids)
    if n > limits.max_requests_per_snapshot:
        raise InvalidArgumentError(
            f"{field}.id",
            f"{n} requests exceed the limit of {limits.max_requests_per_snapshot} per snapshot",
        )

    def column(name: str, default: float) -> FloatArray:
        values = getattr(msg, name)
        if len(values) not in (0, n):
            raise InvalidArgumentError(
                f"{field}.{name}", f"{len(values)} values for {n} ids (give {n} or none)"
            )
        if not len(values):
            return np.full(n, default, dtype=np.float64)
        return np.array(values, dtype=np.float64)

    state = column("state", 0.0).astype(np.int64)
    times = [column(name, math.nan) for name in TIME_FIELDS]
    counts = [column(name, 0.0) for name in COUNT_FIELDS]
    slo = [column(name, 0.0) for name in SLO_FIELDS]

    def values(i: int) -> dict[str, Any]:
        row: dict[str, Any] = {"id": ids[i], "state": int(state[i])}
        for name, t in zip(TIME_FIELDS, times, strict=True):
            row[name] = None if math.isnan(t[i]) else float(t[i])
        for name, c in zip(COUNT_FIELDS, counts, strict=True):
            row[name] = int(c[i])
        for name, c in zip(SLO_FIELDS, slo, strict=True):
            row[name] = float(c[i])
        return row

    return _Rows(
        ids=ids,
        state=state,
        times=times,
        bad_times=[np.isinf(t) for t in times],
        counts=counts,
        slo=slo,
        path=lambda i, name: f"{field}.{name}[{i}]",
        values=values,
    )


def _absent_as_nan(
    requests: Any, name: str, values: FloatArray, matters: npt.NDArray[np.bool_]
) -> FloatArray:
    """A proto3 optional reads 0.0 when unset: 0.0 becomes NaN (absent),
    except in rows that matter where presence decides."""
    zero = values == 0.0
    if not zero.any():
        return values
    out = values.copy()
    out[zero & ~matters] = math.nan
    check = np.flatnonzero(zero & matters)
    if check.size:
        present = np.fromiter(
            (requests[i].HasField(name) for i in check.tolist()), dtype=np.bool_, count=check.size
        )
        out[check[~present]] = math.nan
    return out


def _suspect_rows(rows: _Rows, now_s: float, block_level: bool) -> npt.NDArray[np.bool_]:
    """Rows that may be invalid (a superset of the invalid ones)."""
    n = len(rows.ids)
    state = rows.state
    bad: npt.NDArray[np.bool_] = np.zeros(n, dtype=np.bool_)
    if n and not 0 < min(map(len, rows.ids)) <= max(map(len, rows.ids)) <= MAX_ID_LENGTH:
        lengths = np.fromiter(map(len, rows.ids), dtype=np.int64, count=n)
        bad |= (lengths == 0) | (lengths > MAX_ID_LENGTH)
    bad |= ~np.isin(state, list(_STATES))
    for invalid, value in zip(rows.bad_times, rows.times, strict=True):
        bad |= invalid | (value > now_s) | (value < -MAX_TIME_S)
    for s, name in _REQUIRED_TIME.items():
        bad |= (state == int(s)) & np.isnan(rows.times[TIME_FIELDS.index(name)])
    for c in rows.counts:
        bad |= ~np.isfinite(c) | (c < 0) | (c > MAX_BLOCKS)
    prompt, gpu, cpu, synced = rows.counts[0], rows.counts[1], rows.counts[2], rows.counts[4]
    bad |= (state == int(RequestState.WAITING)) & (prompt == 0)
    if not block_level:
        bad |= (state == int(RequestState.ROTARY)) & (cpu == 0)
    bad |= synced > gpu
    for slo in rows.slo:
        bad |= ~np.isfinite(slo) | (slo < 0) | (slo > MAX_SLO_S)
    return bad


def _validate_row(
    row: dict[str, Any], path: Callable[[str], str], now_s: float, block_level: bool
) -> None:
    """Raise naming the first bad field of one request, or return. Absent
    times are None."""
    if not row["id"]:
        raise InvalidArgumentError(path("id"), "required (a non-empty string)")
    if len(row["id"]) > MAX_ID_LENGTH:
        raise InvalidArgumentError(path("id"), f"longer than {MAX_ID_LENGTH} characters")
    if row["state"] not in _STATES:
        names = ", ".join(s.name for s in RequestState)
        raise InvalidArgumentError(path("state"), f"must be one of {names}, got {row['state']}")
    state = RequestState(row["state"])
    for name in TIME_FIELDS:
        if row[name] is not None:
            value = _time(path(name), row[name])
            if value > now_s:
                raise InvalidArgumentError(path(name), f"{value} is after snapshot.now_s {now_s}")
    required = _REQUIRED_TIME[state]
    if row[required] is None:
        raise InvalidArgumentError(path(required), f"required for a {state.name} request")
    for name in COUNT_FIELDS:
        block_count(path(name), row[name])
    if state == RequestState.WAITING and row["prompt_blocks"] == 0:
        raise InvalidArgumentError(path("prompt_blocks"), "a WAITING request needs >= 1 block")
    if state == RequestState.ROTARY and row["cpu_blocks"] == 0 and not block_level:
        raise InvalidArgumentError(path("cpu_blocks"), "a ROTARY request holds >= 1 CPU block")
    if row["synced_blocks"] > row["gpu_blocks"]:
        raise InvalidArgumentError(
            path("synced_blocks"),
            f"{row['synced_blocks']} exceeds gpu_blocks {row['gpu_blocks']}",
        )
    for name in SLO_FIELDS:
        value = finite(path(name), row[name])
        if value < 0:
            raise InvalidArgumentError(
                path(name), f"must be > 0 (or 0 for the request-level SLO), got {value}"
            )
        at_most(path(name), value, MAX_SLO_S, " s")


def _time(field: str, value: float) -> float:
    if not abs(finite(field, value)) <= MAX_TIME_S:
        raise InvalidArgumentError(
            field, f"must be in [-{MAX_TIME_S:g}, {MAX_TIME_S:g}] s, got {value}"
        )
    return value


def _check_unique_ids(rows: _Rows) -> None:
    ids = rows.ids
    if len(set(ids)) == len(ids):
        return
    first: dict[str, int] = {}
    for i, request_id in enumerate(ids):
        if request_id in first:
            other = rows.path(first[request_id], "id")
            raise InvalidArgumentError(
                rows.path(i, "id"), f"duplicate id {request_id!r} (also {other})"
            )
        first[request_id] = i


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


def _check_request_block_ids(
    field: str,
    r: common_pb2.TrackedRequest,
    gpu_ids: tuple[int, ...],
    cpu_ids: tuple[int, ...],
    block_size: int,
) -> None:
    state = RequestState(r.state)
    block_ids(f"{field}.gpu_block_ids", gpu_ids)
    block_ids(f"{field}.cpu_block_ids", cpu_ids, allow_none=state == RequestState.RUNNING)
    if state == RequestState.WAITING and (gpu_ids or cpu_ids):
        name = "gpu_block_ids" if gpu_ids else "cpu_block_ids"
        raise InvalidArgumentError(f"{field}.{name}", "a WAITING request holds no blocks")
    if state == RequestState.ROTARY:
        if gpu_ids:
            raise InvalidArgumentError(
                f"{field}.gpu_block_ids", "a ROTARY request holds no GPU blocks"
            )
        if not cpu_ids:
            raise InvalidArgumentError(
                f"{field}.cpu_block_ids", "a ROTARY request holds >= 1 CPU block"
            )
        if r.cpu_blocks not in (0, len(cpu_ids)):
            raise InvalidArgumentError(
                f"{field}.cpu_blocks", f"{r.cpu_blocks} disagrees with {len(cpu_ids)} cpu_block_ids"
            )
    if state == RequestState.RUNNING:
        if r.gpu_blocks not in (0, len(gpu_ids)):
            raise InvalidArgumentError(
                f"{field}.gpu_blocks", f"{r.gpu_blocks} disagrees with {len(gpu_ids)} gpu_block_ids"
            )
        if len(cpu_ids) > len(gpu_ids):
            raise InvalidArgumentError(
                f"{field}.cpu_block_ids", f"{len(cpu_ids)} entries for {len(gpu_ids)} GPU blocks"
            )
        full = (
            max(len(gpu_ids) - 1, 0)
            if r.num_tokens == 0
            else min(r.num_tokens // block_size, len(gpu_ids))
        )
        for i, b in enumerate(cpu_ids):
            if b != NO_BLOCK and i >= full:
                raise InvalidArgumentError(
                    f"{field}.cpu_block_ids[{i}]",
                    f"logical block {i} is not full ({full} full blocks), so it cannot "
                    "have a SYNCED CPU copy",
                )


def _check_block_ids_disjoint(
    field: str,
    pools: BlockPools,
    gpu_ids: list[tuple[int, ...]],
    cpu_ids: list[tuple[int, ...]],
    limits: ServiceLimits,
) -> None:
    """Each GPU block and each CPU block belongs to one owner at most."""
    for pool, free_name, free, req_name, owned in (
        ("GPU", "free_gpu_block_ids", pools.free_gpu_block_ids, "gpu_block_ids", gpu_ids),
        ("CPU", "free_cpu_block_ids", pools.free_cpu_block_ids, "cpu_block_ids", cpu_ids),
    ):
        total = len(free) + sum(map(len, owned))
        if total > limits.max_block_ids_per_snapshot:
            raise InvalidArgumentError(field, "more block ids than the per-snapshot limit")
        flat = np.fromiter(
            itertools.chain(free, itertools.chain.from_iterable(owned)), dtype=np.int64, count=total
        )
        flat = np.sort(flat[flat != NO_BLOCK])
        if not (flat[1:] == flat[:-1]).any():
            continue
        sources = [(f"{field}.pools.{free_name}", free)]
        sources += [(f"{field}.requests[{i}].{req_name}", ids) for i, ids in enumerate(owned)]
        owner: dict[int, str] = {}
        for path, ids in sources:
            for j, b in enumerate(ids):
                if b == NO_BLOCK:
                    continue
                if b in owner:
                    raise InvalidArgumentError(
                        f"{path}[{j}]", f"{pool} block {b} is also in {owner[b]}"
                    )
                owner[b] = path
