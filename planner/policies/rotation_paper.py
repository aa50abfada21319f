"""SuperInfer's Largest-VLT-First as its Algorithm 1 prints it (DESIGN.md
§3.1), the `lvf-paper` variant: contention check, sort by VLT, prioritize
within the free blocks plus B_xfer, preempt from the tail until the extra
blocks are freed. B_xfer bounds only the blocks preemption must free, so
swap-ins into free blocks cost nothing; it is given, or derived from the
link's large-copy rate times the previous iteration's compute time.
"""

from __future__ import annotations

import math

import numpy as np

from planner.domain.rotation import PAPER_TRANSFER_BUDGET_BLOCKS, BudgetSource, RotationInputs
from planner.policies.rotation_columns import (
    EMPTY_ROWS,
    NO_PREEMPTION,
    RUNNING,
    Decision,
    IntArray,
    Pools,
    Preemption,
    Ranking,
    RotationColumns,
    blocks_needed,
    greedy_fit,
    grouped_lag_and_need,
    virtual_lag_time,
)


def transfer_budget(
    last_iteration_s: float | None, block_size_tokens: int, inputs: RotationInputs
) -> tuple[int, BudgetSource]:
    """B_xfer: given, else link bandwidth x overlap window / block bytes, else
    the paper's 2400 blocks."""
    given = inputs.params.transfer_budget_blocks
    if given is not None:
        return given, BudgetSource.GIVEN
    if inputs.model is not None and inputs.hardware is not None and last_iteration_s is not None:
        rate, block_bytes = _link_constants(inputs, block_size_tokens)
        blocks = math.floor(rate * last_iteration_s / block_bytes)
        return blocks, BudgetSource.DERIVED
    return PAPER_TRANSFER_BUDGET_BLOCKS, BudgetSource.DEFAULT


# The last inputs' swap rate and block bytes (a replay asks with the same
# inputs every iteration): one entry, so it holds on to one inputs at most.
_last_link: list[tuple[RotationInputs, int, float, int]] = []


def _link_constants(inputs: RotationInputs, block_size_tokens: int) -> tuple[float, int]:
    """The hardware's swap bytes per second and the model's block bytes."""
    for last in _last_link:
        if last[0] is inputs and last[1] == block_size_tokens:
            return last[2], last[3]
    assert inputs.model is not None and inputs.hardware is not None
    rate = inputs.hardware.swap_bytes_per_s()
    block_bytes = inputs.model.block_bytes(block_size_tokens)
    _last_link[:] = [(inputs, block_size_tokens, rate, block_bytes)]
    return rate, block_bytes


def preempt_from_tail(
    cols: RotationColumns,
    candidates: IntArray,
    swap_blocks: int,
    cpu_room: int | None,
) -> Preemption:
    """Preempt candidates (already ordered tail first) until swap_blocks are
    freed. A candidate whose DIRTY blocks do not fit in cpu_room is skipped."""
    if swap_blocks <= 0 or candidates.size == 0:
        return NO_PREEMPTION
    gpu = cols.gpu_blocks[candidates]
    dirty = gpu - cols.synced_blocks[candidates] if cpu_room is not None else None
    if cpu_room is None or dirty is None or (dirty.sum() <= cpu_room and dirty.min() >= 0):
        # Every candidate's DIRTY blocks fit (greedy_fit would take them all).
        freed = gpu.cumsum()
        walked = min(int(freed.searchsorted(swap_blocks, side="left")) + 1, candidates.size)
        return Preemption(candidates[:walked], int(freed[walked - 1]), EMPTY_ROWS)
    fits, _ = greedy_fit(dirty, cpu_room)
    freed = np.where(fits, gpu, 0).cumsum()
    # The walk stops at the candidate whose blocks cover swap_blocks.
    walked = min(int(freed.searchsorted(swap_blocks, side="left")) + 1, candidates.size)
    fits, candidates = fits[:walked], candidates[:walked]
    return Preemption(candidates[fits], int(freed[walked - 1]), candidates[~fits])


def decide_paper(
    cols: RotationColumns,
    pools: Pools,
    inputs: RotationInputs,
    ranking: Ranking,
    grouped: tuple[int, int] | None = None,
) -> Decision:
    """One iteration of Largest-VLT-First (DESIGN.md §3.1, Algorithm 1).
    grouped (a, b): the rows come grouped by state, WAITING in [0, a),
    RUNNING in [a, b) and ROTARY from b (as an engine lists them), which
    saves work, not changes the result."""
    state = cols.state
    budget, source = transfer_budget(pools.last_iteration_s, pools.block_size_tokens, inputs)
    free = pools.free_gpu_blocks
    if grouped is not None and grouped[0] == 0 and grouped[1] == len(state) and free >= 0:
        # Every row RUNNING (nobody to admit or resume): as below.
        return Decision(
            True,
            EMPTY_ROWS,
            NO_PREEMPTION,
            EMPTY_ROWS,
            budget,
            source,
            0,
            free + budget,
            0,
            0,
            None,
            None,
            None,
        )
    running = state == RUNNING
    inactive = (~running).nonzero()[0]
    if not inactive.size and free >= 0:
        # Nobody to admit or resume: no contention, nothing to rank.
        return Decision(
            True,
            EMPTY_ROWS,
            NO_PREEMPTION,
            EMPTY_ROWS,
            budget,
            source,
            0,
            free + budget,
            0,
            0,
            None,
            None,
            running,
        )
    if grouped is not None:
        vlt, need = grouped_lag_and_need(cols, pools.now_s, inputs, grouped)
    else:
        vlt = virtual_lag_time(cols, pools.now_s, inputs)
        need = blocks_needed(cols)
    total_needed = int(need[inactive].sum())

    if free >= total_needed:
        return Decision(
            fallback=True,
            prioritized=ranking.by_arrival(inactive),
            preemption=NO_PREEMPTION,
            trimmed=EMPTY_ROWS,
            budget=budget,
            budget_source=source,
            blocks_needed=total_needed,
            blocks_left=free + budget - total_needed,
            swap_blocks_needed=0,
            unmet_swap_blocks=0,
            vlt=vlt,
            need=need,
            running=running,
        )
    candidates, preemptable = ranking.by_lag(vlt, ~running & (vlt >= 0), running & (vlt < 0))
    taken, blocks_left = greedy_fit(need[candidates], free + budget)
    prioritized = candidates[taken]
    swap_needed = budget - blocks_left
    chosen = preempt_from_tail(cols, preemptable, swap_needed, pools.cpu_room)
    unmet = max(swap_needed - chosen.freed_blocks, 0)
    trimmed = EMPTY_ROWS
    if unmet > 0:
        picked = prioritized
        prioritized = _trim(prioritized, need, unmet)
        trimmed = picked[prioritized.size :][::-1]
        blocks_left = free + budget - int(need[prioritized].sum())
        swap_needed = budget - blocks_left
        # Keep the first pass's CPU-full skips: they are why it fell short.
        skipped = chosen.cpu_full_skipped
        chosen = preempt_from_tail(cols, preemptable, budget - blocks_left, pools.cpu_room)
        chosen = Preemption(chosen.rows, chosen.freed_blocks, skipped)
    return Decision(
        fallback=False,
        prioritized=prioritized,
        preemption=chosen,
        trimmed=trimmed,
        budget=budget,
        budget_source=source,
        blocks_needed=total_needed,
        blocks_left=blocks_left,
        swap_blocks_needed=max(swap_needed, 0),
        unmet_swap_blocks=unmet,
        vlt=vlt,
        need=need,
        running=running,
    )


def _trim(prioritized: IntArray, need: IntArray, deficit: int) -> IntArray:
    """Drop the least lagging prioritized requests until deficit blocks are
    given back: preemption could not free enough room for all of them."""
    dropped = np.cumsum(need[prioritized][::-1])
    k = int(np.searchsorted(dropped, deficit, side="left")) + 1
    return prioritized[: max(prioritized.size - k, 0)]
