"""SLO-aware rotation: SuperInfer's RotaSched Largest-VLT-First (DESIGN.md §3.1).

Once per engine iteration: rank every tracked request by Virtual Lag Time,
prioritize lagging WAITING/ROTARY requests within the free blocks plus the
transfer budget, and preempt the longest-running RUNNING requests to make
room. The DuplexKV transfer plan (planner.policies.duplexkv) carries it out.

The decision itself (and the transfers at count level) lives in
planner.policies.rotation_columns, which works on columns and row indices;
plan_rotation runs it on the snapshot's table and turns its rows into the
plan's decisions, explanation and summary. The replay engine runs the same
decision on its own columns.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from planner.domain.requests import RequestState, RequestTable, Snapshot
from planner.domain.rotation import (
    BudgetSource,
    Held,
    RequestDecision,
    RotationExplanation,
    RotationInputs,
    RotationPlan,
)
from planner.policies import duplexkv
from planner.policies import rotation_columns as lvf
from planner.policies.ordering import nan_last, order_rows
from planner.policies.rotation_columns import greedy_fit
from planner.policies.rotation_decide import decide
from planner.policies.rotation_paper import transfer_budget as paper_transfer_budget

__all__ = [
    "blocks_needed",
    "fcfs_order",
    "greedy_fit",
    "plan_rotation",
    "ranking_order",
    "transfer_budget",
    "virtual_lag_time",
]

_STATE_BY_VALUE = {int(s): s for s in RequestState}
# Ids listed in a plan's one-line summary.
_SUMMARY_IDS = 4

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def virtual_lag_time(table: RequestTable, now_s: float, inputs: RotationInputs) -> FloatArray:
    """VLT of every request at now_s (see rotation_columns.virtual_lag_time)."""
    return lvf.virtual_lag_time(table, now_s, inputs)


def blocks_needed(table: RequestTable) -> IntArray:
    """GPU blocks a request needs to run: its prompt plus one for the first
    decode (WAITING), its CPU-resident blocks (ROTARY), none (RUNNING)."""
    return lvf.blocks_needed(table)


def transfer_budget(snapshot: Snapshot, inputs: RotationInputs) -> tuple[int, BudgetSource]:
    """B_xfer: given, else link bandwidth x overlap window / block bytes, else
    the paper's 2400 blocks."""
    return paper_transfer_budget(snapshot.last_iteration_s, snapshot.block_size_tokens, inputs)


def ranking_order(table: RequestTable, vlt: FloatArray) -> IntArray:
    """Row indices by VLT descending; ties by earlier arrival (absent last),
    then by id."""
    rows = np.arange(len(table), dtype=np.int64)
    return order_rows(rows, (-vlt, nan_last(table.arrival_s)), table.ids)


def fcfs_order(table: RequestTable, rows: IntArray) -> IntArray:
    """rows by arrival (absent last), then id."""
    return order_rows(rows, (nan_last(table.arrival_s),), table.ids)


def _ids(table: RequestTable, rows: IntArray) -> tuple[str, ...]:
    return tuple(map(table.ids.__getitem__, rows.tolist()))


def _decisions(
    table: RequestTable, rows: IntArray, vlt: FloatArray | None, blocks: IntArray | None
) -> tuple[RequestDecision, ...]:
    if not rows.size or vlt is None or blocks is None:
        return ()
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
    pools = lvf.Pools(
        now_s=snapshot.now_s,
        free_gpu_blocks=snapshot.free_gpu_blocks,
        free_cpu_blocks=snapshot.free_cpu_blocks,
        cpu_room=_cpu_room(snapshot),
        last_iteration_s=snapshot.last_iteration_s,
        block_size_tokens=snapshot.block_size_tokens,
        max_batched_tokens=snapshot.max_batched_tokens,
        max_running=snapshot.max_running_requests,
    )
    d = decide(table, pools, inputs, lvf.TableRanking(table.arrival_s, table.ids))
    prioritized = d.prioritized
    chosen = d.preemption
    if snapshot.pools is not None:
        transfers = duplexkv.plan_transfers(
            snapshot,
            inputs,
            prioritized=prioritized,
            preempted=chosen.rows,
            budget_blocks=d.budget,
            eager_cap_blocks=None if d.link is None else d.link.d2h_left(),
        )
    else:
        transfers = lvf.count_transfers(table, pools, inputs, d)
    if transfers.deferred_rows.size:
        prioritized = prioritized[~np.isin(prioritized, transfers.deferred_rows)]
    # A preempted request is RUNNING: preemption needs a VLT only where
    # something was ranked.
    prioritized_decisions = _decisions(table, prioritized, d.vlt, d.need)
    preempted_decisions = _decisions(table, chosen.rows, d.vlt, table.gpu_blocks)
    free = snapshot.free_gpu_blocks
    explanation = RotationExplanation(
        transfer_budget_blocks=d.budget,
        budget_source=d.budget_source,
        free_gpu_blocks=free,
        blocks_needed=d.blocks_needed,
        blocks_left=d.blocks_left,
        swap_blocks_needed=d.swap_blocks_needed,
        blocks_released_now=transfers.blocks_released_now,
        blocks_freed_after_d2h=transfers.blocks_freed_after_d2h,
        swap_in_blocks=transfers.swap_in_blocks,
        swap_out_blocks=transfers.swap_out_blocks,
        eager_blocks=transfers.eager_blocks,
        unmet_swap_blocks=d.unmet_swap_blocks,
        deferred_swap_in_ids=_ids(table, transfers.deferred_rows),
        cpu_full_skipped_ids=_ids(table, chosen.cpu_full_skipped),
        trimmed_ids=_ids(table, d.trimmed),
        summary=_summary(
            fallback=d.fallback,
            free=free,
            needed=d.blocks_needed,
            budget=d.budget,
            source=d.budget_source,
            prioritized=prioritized_decisions,
            preempted=preempted_decisions,
            transfers=transfers,
        )
        + _link_summary(d),
        variant=inputs.params.variant,
        d2h_budget_blocks=d.link.budget.d2h_blocks if d.link is not None else 0,
        link_half_duplex=d.link.budget.shared if d.link is not None else False,
        held=d.held if d.held is not None else Held(),
    )
    return RotationPlan(
        fcfs_fallback=d.fallback,
        prioritized=prioritized_decisions,
        preempted=preempted_decisions,
        explanation=explanation,
        batches=transfers.batches,
        moves=transfers.moves,
        released_gpu_block_ids=transfers.released_gpu_block_ids,
        freed_after_d2h_gpu_block_ids=transfers.freed_after_d2h_gpu_block_ids,
    )


def _link_summary(d: lvf.Decision) -> str:
    """LVF's charges and why it left requests out."""
    if d.link is None:
        return ""
    b = d.link.budget
    budget = f"{b.h2d_blocks} both ways" if b.shared else f"{b.h2d_blocks} in, {b.d2h_blocks} out"
    held = d.held if d.held is not None else Held()
    reasons = [
        (held.engine_full, "engine full"),
        (held.link_full, "link budget spent"),
        (held.not_lagging, "not lagging"),
        (held.no_victim, "no running request to spare"),
    ]
    left_out = ", ".join(f"{n} {why}" for n, why in reasons if n)
    return f"; link budget {budget} ({b.source.name.lower()})" + (
        f"; held back: {left_out}" if left_out else ""
    )


def _cpu_room(snapshot: Snapshot) -> int | None:
    """Free CPU blocks that preempted requests' DIRTY blocks may fill. At block
    level the pool's ids bound it even when free_cpu_blocks is unset."""
    room = snapshot.free_cpu_blocks
    if snapshot.pools is not None:
        ids = len(snapshot.pools.free_cpu_block_ids)
        room = ids if room is None else min(room, ids)
    return room


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
