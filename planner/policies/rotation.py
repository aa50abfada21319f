"""SLO-aware rotation: SuperInfer's RotaSched Largest-VLT-First (DESIGN.md §3.1).

Once per engine iteration: rank every tracked request by Virtual Lag Time,
prioritize lagging WAITING/ROTARY requests within the free blocks plus the
transfer budget, and preempt the longest-running RUNNING requests to make
room. The DuplexKV transfer plan (planner.policies.duplexkv) carries it out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from planner.domain.requests import RequestState, RequestTable, Snapshot
from planner.domain.rotation import (
    PAPER_TRANSFER_BUDGET_BLOCKS,
    BudgetSource,
    RequestDecision,
    RotationExplanation,
    RotationInputs,
    RotationPlan,
)
from planner.policies import duplexkv
from planner.policies.ordering import nan_last, order_rows

WAITING = np.int8(RequestState.WAITING)
RUNNING = np.int8(RequestState.RUNNING)
ROTARY = np.int8(RequestState.ROTARY)

# After this many skip-and-resume rounds of the vectorized prioritize pass,
# finish with a plain loop (bounds the worst case at O(n * rounds)).
_MAX_VECTOR_ROUNDS = 16
_STATE_BY_VALUE = {int(s): s for s in RequestState}
# Ids listed in a plan's one-line summary.
_SUMMARY_IDS = 4

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def virtual_lag_time(table: RequestTable, now_s: float, inputs: RotationInputs) -> FloatArray:
    """VLT of every request at now_s.

    ROTARY: alpha * relu(now - t_last_token - beta_tbt * slo_tbt);
    WAITING: relu(now - t_arrival - beta_ttft * slo_ttft);
    RUNNING: -(now - t_run_start).
    """
    p = inputs.params
    ttft = np.where(np.isnan(table.slo_ttft_s), inputs.slo.ttft_s, table.slo_ttft_s)
    tbt = np.where(np.isnan(table.slo_tbt_s), inputs.slo.tbt_s, table.slo_tbt_s)
    waiting = np.maximum(now_s - table.arrival_s - p.beta_ttft * ttft, 0.0)
    rotary = p.alpha * np.maximum(now_s - table.last_token_s - p.beta_tbt * tbt, 0.0)
    running = table.run_start_s - now_s
    state = table.state
    vlt: FloatArray = np.where(
        state == WAITING, waiting, np.where(state == ROTARY, rotary, running)
    )
    return vlt


def blocks_needed(table: RequestTable) -> IntArray:
    """GPU blocks a request needs to run: its prompt plus one for the first
    decode (WAITING), its CPU-resident blocks (ROTARY), none (RUNNING)."""
    need: IntArray = np.where(
        table.state == WAITING,
        table.prompt_blocks + 1,
        np.where(table.state == ROTARY, table.cpu_blocks, 0),
    )
    return need


def transfer_budget(snapshot: Snapshot, inputs: RotationInputs) -> tuple[int, BudgetSource]:
    """B_xfer: given, else link bandwidth x overlap window / block bytes, else
    the paper's 2400 blocks."""
    given = inputs.params.transfer_budget_blocks
    if given is not None:
        return given, BudgetSource.GIVEN
    window = snapshot.last_iteration_s
    if inputs.model is not None and inputs.hardware is not None and window is not None:
        block_bytes = inputs.model.block_bytes(snapshot.block_size_tokens)
        blocks = math.floor(inputs.hardware.swap_bytes_per_s() * window / block_bytes)
        return blocks, BudgetSource.DERIVED
    return PAPER_TRANSFER_BUDGET_BLOCKS, BudgetSource.DEFAULT


def ranking_order(table: RequestTable, vlt: FloatArray) -> IntArray:
    """Row indices by VLT descending; ties by earlier arrival (absent last),
    then by id."""
    rows = np.arange(len(table), dtype=np.int64)
    return order_rows(rows, (-vlt, nan_last(table.arrival_s)), table.ids)


def fcfs_order(table: RequestTable, rows: IntArray) -> IntArray:
    """rows by arrival (absent last), then id."""
    return order_rows(rows, (nan_last(table.arrival_s),), table.ids)


def greedy_fit(needs: IntArray, capacity: int) -> tuple[npt.NDArray[np.bool_], int]:
    """Walk needs in order, taking each that fits in what is left and going on
    past those that do not. Returns the taken mask and what is left."""
    taken = np.zeros(len(needs), dtype=np.bool_)
    left = capacity
    # What is left only shrinks: a need larger than it never fits again.
    fitting = (needs <= left).nonzero()[0]
    rounds = 0
    while fitting.size and rounds < _MAX_VECTOR_ROUNDS:
        rounds += 1
        cumulative = needs[fitting].cumsum()
        k = int(cumulative.searchsorted(left, side="right"))
        taken[fitting[:k]] = True
        left -= int(cumulative[k - 1])
        if k == fitting.size:
            return taken, left
        # fitting[k] does not fit in what is left.
        rest = fitting[k + 1 :]
        fitting = rest[needs[rest] <= left]
    for j in fitting.tolist():
        need = int(needs[j])
        if need <= left:
            taken[j] = True
            left -= need
    return taken, left


@dataclass(frozen=True, slots=True)
class _Preemption:
    rows: IntArray
    freed_blocks: int
    cpu_full_skipped: IntArray


def preempt_from_tail(
    table: RequestTable,
    candidates: IntArray,
    swap_blocks: int,
    cpu_room: int | None,
) -> _Preemption:
    """Preempt candidates (already ordered tail first) until swap_blocks are
    freed. A candidate whose DIRTY blocks do not fit in cpu_room is skipped."""
    empty = np.zeros(0, dtype=np.int64)
    if swap_blocks <= 0 or candidates.size == 0:
        return _Preemption(empty, 0, empty)
    gpu = table.gpu_blocks[candidates]
    if cpu_room is None:
        fits = np.ones(candidates.size, dtype=np.bool_)
    else:
        fits, _ = greedy_fit(gpu - table.synced_blocks[candidates], cpu_room)
    freed = np.where(fits, gpu, 0).cumsum()
    # The walk stops at the candidate whose blocks cover swap_blocks.
    walked = min(int(freed.searchsorted(swap_blocks, side="left")) + 1, candidates.size)
    fits, candidates = fits[:walked], candidates[:walked]
    return _Preemption(candidates[fits], int(freed[walked - 1]), candidates[~fits])


def _ids(table: RequestTable, rows: IntArray) -> tuple[str, ...]:
    return tuple(map(table.ids.__getitem__, rows.tolist()))


def _decisions(
    table: RequestTable, rows: IntArray, vlt: FloatArray, blocks: IntArray
) -> tuple[RequestDecision, ...]:
    return tuple(
        map(
            RequestDecision,
            _ids(table, rows),
            map(_STATE_BY_VALUE.__getitem__, table.state[rows].tolist()),
            vlt[rows].tolist(),
            blocks[rows].tolist(),
        )
    )


def plan_rotation(snapshot: Snapshot, inputs: RotationInputs) -> RotationPlan:
    """One iteration of Largest-VLT-First plus its DuplexKV transfer plan."""
    table = snapshot.requests
    vlt = virtual_lag_time(table, snapshot.now_s, inputs)
    need = blocks_needed(table)
    budget, source = transfer_budget(snapshot, inputs)
    inactive = (table.state != RUNNING).nonzero()[0]
    total_needed = int(need[inactive].sum())
    free = snapshot.free_gpu_blocks
    cpu_room = _cpu_room(snapshot)

    if free >= total_needed:
        prioritized = fcfs_order(table, inactive)
        chosen = _Preemption(np.zeros(0, dtype=np.int64), 0, np.zeros(0, dtype=np.int64))
        blocks_left = free + budget - total_needed
        swap_needed = 0
        unmet = 0
        trimmed = np.zeros(0, dtype=np.int64)
        fallback = True
    else:
        fallback = False
        order = ranking_order(table, vlt)
        running_sorted = table.state[order] == RUNNING
        vlt_sorted = vlt[order]
        candidates = order[~running_sorted & (vlt_sorted >= 0)]
        taken, blocks_left = greedy_fit(need[candidates], free + budget)
        prioritized = candidates[taken]
        swap_needed = budget - blocks_left
        preemptable = order[running_sorted & (vlt_sorted < 0)][::-1]
        chosen = preempt_from_tail(table, preemptable, swap_needed, cpu_room)
        unmet = max(swap_needed - chosen.freed_blocks, 0)
        trimmed = np.zeros(0, dtype=np.int64)
        if unmet > 0:
            picked = prioritized
            prioritized = _trim(prioritized, need, unmet)
            trimmed = picked[prioritized.size :][::-1]
            blocks_left = free + budget - int(need[prioritized].sum())
            swap_needed = budget - blocks_left
            # Keep the first pass's CPU-full skips: they are why it fell short.
            skipped = chosen.cpu_full_skipped
            chosen = preempt_from_tail(table, preemptable, budget - blocks_left, cpu_room)
            chosen = _Preemption(chosen.rows, chosen.freed_blocks, skipped)

    transfers = duplexkv.plan_transfers(
        snapshot, inputs, prioritized=prioritized, preempted=chosen.rows, budget_blocks=budget
    )
    if transfers.deferred_rows.size:
        prioritized = prioritized[~np.isin(prioritized, transfers.deferred_rows)]
    prioritized_decisions = _decisions(table, prioritized, vlt, need)
    preempted_decisions = _decisions(table, chosen.rows, vlt, table.gpu_blocks)
    explanation = RotationExplanation(
        transfer_budget_blocks=budget,
        budget_source=source,
        free_gpu_blocks=free,
        blocks_needed=total_needed,
        blocks_left=blocks_left,
        swap_blocks_needed=max(swap_needed, 0),
        blocks_released_now=transfers.blocks_released_now,
        blocks_freed_after_d2h=transfers.blocks_freed_after_d2h,
        swap_in_blocks=transfers.swap_in_blocks,
        swap_out_blocks=transfers.swap_out_blocks,
        eager_blocks=transfers.eager_blocks,
        unmet_swap_blocks=unmet,
        deferred_swap_in_ids=_ids(table, transfers.deferred_rows),
        cpu_full_skipped_ids=_ids(table, chosen.cpu_full_skipped),
        trimmed_ids=_ids(table, trimmed),
        summary=_summary(
            fallback=fallback,
            free=free,
            needed=total_needed,
            budget=budget,
            source=source,
            prioritized=prioritized_decisions,
            preempted=preempted_decisions,
            transfers=transfers,
        ),
    )
    return RotationPlan(
        fcfs_fallback=fallback,
        prioritized=prioritized_decisions,
        preempted=preempted_decisions,
        explanation=explanation,
        batches=transfers.batches,
        moves=transfers.moves,
        released_gpu_block_ids=transfers.released_gpu_block_ids,
        freed_after_d2h_gpu_block_ids=transfers.freed_after_d2h_gpu_block_ids,
    )


def _cpu_room(snapshot: Snapshot) -> int | None:
    """Free CPU blocks that preempted requests' DIRTY blocks may fill. At block
    level the pool's ids bound it even when free_cpu_blocks is unset."""
    room = snapshot.free_cpu_blocks
    if snapshot.pools is not None:
        ids = len(snapshot.pools.free_cpu_block_ids)
        room = ids if room is None else min(room, ids)
    return room


def _trim(prioritized: IntArray, need: IntArray, deficit: int) -> IntArray:
    """Drop the least lagging prioritized requests until deficit blocks are
    given back: preemption could not free enough room for all of them."""
    dropped = np.cumsum(need[prioritized][::-1])
    k = int(np.searchsorted(dropped, deficit, side="left")) + 1
    return prioritized[: max(prioritized.size - k, 0)]


def _names(decisions: tuple[RequestDecision, ...]) -> str:
    shown = ", ".join(f"{d.id} ({d.vlt:+.3f})" for d in decisions[:_SUMMARY_IDS])
    more = len(decisions) - _SUMMARY_IDS
    return shown + (f" and {more} more" if more > 0 else "") if decisions else "none"


def _summary(
    *,
    fallback: bool,
    free: int,
    needed: int,
    budget: int,
    source: BudgetSource,
    prioritized: tuple[RequestDecision, ...],
    preempted: tuple[RequestDecision, ...],
    transfers: duplexkv.TransferPlan,
) -> str:
    head = (
        f"no contention ({needed} blocks needed, {free} free): admit all FCFS"
        if fallback
        else f"contention ({needed} blocks needed, {free} free, "
        f"B_xfer {budget} {source.name.lower()})"
    )
    return (
        f"{head}; prioritized {_names(prioritized)}; preempted {_names(preempted)}; "
        f"moves: {transfers.swap_in_blocks} in, {transfers.swap_out_blocks} out, "
        f"{transfers.eager_blocks} eager, {transfers.blocks_released_now} released"
    )
