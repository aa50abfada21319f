"""DuplexKV transfer planning (DESIGN.md §3.1): the copies that carry out a
rotation decision, race-free so both directions can run at once.

Blocks are DIRTY (being written, or full without a CPU copy) or SYNCED (full,
with an identical CPU copy). A preempted request's SYNCED GPU blocks are
released at once and its DIRTY blocks copied out; a prioritized rotary
request's blocks are copied in, only into blocks that are free now or were
just released (never into a block whose D2H copy is still in flight); newly
full blocks of running requests are copied out eagerly within a budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from planner.domain.requests import NO_BLOCK, RequestState, RequestTable, Snapshot
from planner.domain.rotation import MoveKind, RequestBlockMoves, RotationInputs
from planner.kernels.transfer_batch import BlockExtent, CopyDirection, TransferBatch
from planner.policies.ordering import order_rows

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class TransferPlan:
    swap_in_blocks: int
    swap_out_blocks: int
    eager_blocks: int
    blocks_released_now: int
    blocks_freed_after_d2h: int
    deferred_rows: IntArray
    batches: tuple[TransferBatch, ...] = ()
    moves: tuple[RequestBlockMoves, ...] = ()
    released_gpu_block_ids: tuple[int, ...] = ()
    freed_after_d2h_gpu_block_ids: tuple[int, ...] = ()


def merge_extents(pairs: list[tuple[int, int]]) -> tuple[BlockExtent, ...]:
    """(src, dst) block copies as runs consecutive on both sides."""
    extents: list[BlockExtent] = []
    src0 = dst0 = length = 0
    for src, dst in sorted(pairs):
        if length and src == src0 + length and dst == dst0 + length:
            length += 1
            continue
        if length:
            extents.append(BlockExtent(src0, dst0, length))
        src0, dst0, length = src, dst, 1
    if length:
        extents.append(BlockExtent(src0, dst0, length))
    return tuple(extents)


def eager_order(table: RequestTable, exclude: IntArray) -> IntArray:
    """Running requests, longest running first (the next to be preempted),
    then by id."""
    running = np.flatnonzero(table.state == np.int8(RequestState.RUNNING))
    running = running[~np.isin(running, exclude)]
    return order_rows(running, (table.run_start_s,), table.ids)


def _swap_in_rows(table: RequestTable, prioritized: IntArray) -> IntArray:
    rows: IntArray = prioritized[table.state[prioritized] == np.int8(RequestState.ROTARY)]
    return rows


def _lowest(block_ids: tuple[int, ...], count: int) -> list[int]:
    """The count lowest ids, ascending (lowest ids first keeps extents long)."""
    if count >= len(block_ids):
        return sorted(block_ids)
    ids = np.array(block_ids, dtype=np.int64)
    lowest: list[int] = np.sort(np.partition(ids, count)[:count]).tolist()
    return lowest


def _fit_in_order(sizes: list[int], capacity: int) -> tuple[list[bool], int]:
    fits: list[bool] = []
    for size in sizes:
        ok = size <= capacity
        fits.append(ok)
        if ok:
            capacity -= size
    return fits, capacity


def plan_transfers(
    snapshot: Snapshot,
    inputs: RotationInputs,
    prioritized: IntArray,
    preempted: IntArray,
    budget_blocks: int,
    *,
    eager_cap_blocks: int | None = None,
) -> TransferPlan:
    """Copies for one iteration at block level (the snapshot has pools). The
    count-level plan, for snapshots without block ids, is
    rotation_columns.count_transfers. eager_cap_blocks: eager copies at most
    (what the link budget has left after the swap-outs), on top of the eager
    budget."""
    if snapshot.pools is None:
        raise ValueError("block-level transfers need snapshot.pools")
    return _plan_blocks(
        snapshot, inputs, prioritized, preempted, budget_blocks, eager_cap=eager_cap_blocks
    )


def _eager_budget(
    inputs: RotationInputs, budget_blocks: int, swap_out: int, cap: int | None
) -> int:
    given = inputs.params.eager_budget_blocks
    budget = given if given is not None else max(budget_blocks - swap_out, 0)
    return budget if cap is None else min(budget, cap)


def _plan_blocks(
    snapshot: Snapshot,
    inputs: RotationInputs,
    prioritized: IntArray,
    preempted: IntArray,
    budget_blocks: int,
    *,
    eager_cap: int | None,
) -> TransferPlan:
    t = snapshot.requests
    assert snapshot.pools is not None
    eager_bound = inputs.params.eager_budget_blocks
    eager_most = budget_blocks if eager_bound is None else eager_bound
    if eager_cap is not None:
        eager_most = min(eager_most, eager_cap)
    cpu_needed = int(t.gpu_blocks[preempted].sum()) + eager_most
    cpu_pool = _lowest(snapshot.pools.free_cpu_block_ids, cpu_needed)
    cpu_next = 0
    moves: list[RequestBlockMoves] = []
    d2h: list[tuple[int, int]] = []
    h2d: list[tuple[int, int]] = []
    released: list[int] = []
    freed_after: list[int] = []

    for row in preempted.tolist():
        gpu_ids = t.gpu_block_ids[row]
        cpu_ids = t.cpu_block_ids[row]
        logical: list[int] = []
        src: list[int] = []
        dst: list[int] = []
        for i, gpu in enumerate(gpu_ids):
            if i < len(cpu_ids) and cpu_ids[i] != NO_BLOCK:
                released.append(gpu)
                continue
            logical.append(i)
            src.append(gpu)
            dst.append(cpu_pool[cpu_next])
            cpu_next += 1
        freed_after.extend(src)
        d2h.extend(zip(src, dst, strict=True))
        if logical:
            moves.append(
                RequestBlockMoves(
                    t.ids[row], MoveKind.SWAP_OUT, tuple(logical), tuple(src), tuple(dst)
                )
            )

    swap_in_rows = _swap_in_rows(t, prioritized)
    gpu_needed = int(t.cpu_blocks[swap_in_rows].sum())
    gpu_pool = _lowest(snapshot.pools.free_gpu_block_ids, gpu_needed) + sorted(released)
    gpu_next = 0
    deferred: list[int] = []
    swap_in = 0
    for row in swap_in_rows.tolist():
        cpu_ids = t.cpu_block_ids[row]
        n = len(cpu_ids)
        if n == 0:
            continue
        if n > len(gpu_pool) - gpu_next:
            deferred.append(row)
            continue
        dst = gpu_pool[gpu_next : gpu_next + n]
        gpu_next += n
        swap_in += n
        h2d.extend(zip(cpu_ids, dst, strict=True))
        moves.append(
            RequestBlockMoves(
                t.ids[row], MoveKind.SWAP_IN, tuple(range(n)), tuple(cpu_ids), tuple(dst)
            )
        )

    swap_out = len(freed_after)
    eager_room = min(
        _eager_budget(inputs, budget_blocks, swap_out, eager_cap), len(cpu_pool) - cpu_next
    )
    eager = 0
    for row in eager_order(t, preempted).tolist():
        if eager >= eager_room:
            break
        cpu_ids = t.cpu_block_ids[row]
        fresh = [
            i for i in range(int(t.full_blocks[row])) if i >= len(cpu_ids) or cpu_ids[i] == NO_BLOCK
        ][: eager_room - eager]
        if not fresh:
            continue
        src = [t.gpu_block_ids[row][i] for i in fresh]
        dst = cpu_pool[cpu_next : cpu_next + len(fresh)]
        cpu_next += len(fresh)
        eager += len(fresh)
        d2h.extend(zip(src, dst, strict=True))
        moves.append(
            RequestBlockMoves(t.ids[row], MoveKind.EAGER, tuple(fresh), tuple(src), tuple(dst))
        )

    block_bytes = (
        inputs.model.block_bytes(snapshot.block_size_tokens) if inputs.model is not None else 0
    )
    batches = tuple(
        TransferBatch(direction, merge_extents(pairs), len(pairs), len(pairs) * block_bytes)
        for direction, pairs in ((CopyDirection.D2H, d2h), (CopyDirection.H2D, h2d))
        if pairs
    )
    return TransferPlan(
        swap_in_blocks=swap_in,
        swap_out_blocks=swap_out,
        eager_blocks=eager,
        blocks_released_now=len(released),
        blocks_freed_after_d2h=swap_out,
        deferred_rows=np.array(deferred, dtype=np.int64),
        batches=batches,
        moves=tuple(moves),
        released_gpu_block_ids=tuple(released),
        freed_after_d2h_gpu_block_ids=tuple(freed_after),
    )
