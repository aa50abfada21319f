"""Largest-VLT-First on columns (DESIGN.md §3.1): the decision as row indices,
with its DuplexKV transfer amounts at count level.

This is the policy itself. `plan_rotation` (planner.policies.rotation, what
the gRPC service calls) runs it on a snapshot's table and dresses the result
up as a RotationPlan; the replay engine runs it on columns it gathers from
its own state, without building ids, decisions or a summary it would not
read. Both go through `decide` and, at count level, `count_transfers`.

Orderings are deterministic: VLT descending, then earlier arrival (absent
last), then id. A `TableRanking` sorts by those keys (ids compared as
strings, only where every other key ties); a `KeyRanking` uses a
precomputed integer per row that orders like (arrival, id), valid when ids
are unique. With unique ids both give the same orders: the keys then order
rows strictly, so a subset sorted on its own is in the order the whole table
sorted would give it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from planner.domain.requests import RequestState
from planner.domain.rotation import PAPER_TRANSFER_BUDGET_BLOCKS, BudgetSource, RotationInputs
from planner.policies.duplexkv import TransferPlan
from planner.policies.ordering import nan_last, order_rows

WAITING = np.int8(RequestState.WAITING)
RUNNING = np.int8(RequestState.RUNNING)
ROTARY = np.int8(RequestState.ROTARY)

# After this many skip-and-resume rounds of the vectorized prioritize pass,
# finish with a plain loop (bounds the worst case at O(n * rounds)).
_MAX_VECTOR_ROUNDS = 16

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
StateArray = npt.NDArray[np.int8]
# Unsigned 16-bit where the values fit (radix-sorted), else 64-bit.
RankArray = npt.NDArray[np.uint16] | npt.NDArray[np.int64]

_EMPTY: IntArray = np.zeros(0, dtype=np.int64)
_EMPTY.flags.writeable = False


class RotationColumns(Protocol):
    """What the decision reads of each request: row i of every column is one
    request, as in a RequestTable (which is one); absent times and SLOs are
    NaN. An engine may gather each column only when it is first read."""

    @property
    def state(self) -> StateArray: ...
    @property
    def arrival_s(self) -> FloatArray: ...
    @property
    def run_start_s(self) -> FloatArray: ...
    @property
    def last_token_s(self) -> FloatArray: ...
    @property
    def prompt_blocks(self) -> IntArray: ...
    @property
    def gpu_blocks(self) -> IntArray: ...
    @property
    def cpu_blocks(self) -> IntArray: ...
    @property
    def full_blocks(self) -> IntArray: ...
    @property
    def synced_blocks(self) -> IntArray: ...
    @property
    def slo_ttft_s(self) -> FloatArray: ...
    @property
    def slo_tbt_s(self) -> FloatArray: ...


@dataclass(frozen=True, slots=True)
class Pools:
    """One iteration's numbers besides the requests."""

    now_s: float
    free_gpu_blocks: int
    # None: the CPU pool is not a constraint.
    free_cpu_blocks: int | None
    # Free CPU blocks preempted requests' DIRTY blocks may fill (None: no bound).
    cpu_room: int | None
    # The previous iteration's compute time (the overlap window), if known.
    last_iteration_s: float | None
    block_size_tokens: int


class Ranking(Protocol):
    def by_lag(
        self, vlt: FloatArray, candidates: BoolArray, preemptable: BoolArray
    ) -> tuple[IntArray, IntArray]:
        """The candidate rows by VLT descending (ties: arrival, id), and the
        preemptable rows in the reverse of that order (tail first)."""
        ...

    def by_arrival(self, rows: IntArray) -> IntArray:
        """rows by arrival (absent last), then id."""
        ...


class TableRanking:
    """Orders by the keys themselves, ids compared as strings (any ids)."""

    __slots__ = ("arrival_s", "ids")

    def __init__(self, arrival_s: FloatArray, ids: list[str]) -> None:
        self.arrival_s = arrival_s
        self.ids = ids

    def by_lag(
        self, vlt: FloatArray, candidates: BoolArray, preemptable: BoolArray
    ) -> tuple[IntArray, IntArray]:
        rows = np.arange(len(self.ids), dtype=np.int64)
        order = order_rows(rows, (-vlt, nan_last(self.arrival_s)), self.ids)
        tail_first: IntArray = order[preemptable[order]][::-1]
        return order[candidates[order]], tail_first

    def by_arrival(self, rows: IntArray) -> IntArray:
        return order_rows(rows, (nan_last(self.arrival_s),), self.ids)


class KeyRanking:
    """Orders by an integer per row that sorts like (arrival absent last, id):
    only for unique ids (then no two rows share it). With rows, the integers
    are per request and row i is request rows[i] (gathered when first
    needed). Keys below 2**16 are sorted as 16-bit integers (a radix sort)."""

    __slots__ = ("_key", "_rows", "_source")

    def __init__(self, arrival_id_rank: RankArray, rows: IntArray | None = None) -> None:
        self._source = arrival_id_rank
        self._rows = rows
        self._key: RankArray | None = None if rows is not None else arrival_id_rank

    @property
    def arrival_id_rank(self) -> RankArray:
        if self._key is None:
            assert self._rows is not None
            self._key = self._source[self._rows]
        return self._key

    def by_lag(
        self, vlt: FloatArray, candidates: BoolArray, preemptable: BoolArray
    ) -> tuple[IntArray, IntArray]:
        # By the key first, then stably by VLT: one integer and one float
        # sort, cheaper than a two-key lexsort.
        key = self.arrival_id_rank
        c = candidates.nonzero()[0]
        if c.size > 1:
            c = c[key[c].argsort(kind="stable")]
            c = c[(-vlt[c]).argsort(kind="stable")]
        p = preemptable.nonzero()[0]
        if p.size > 1:
            # Reversed: VLT ascending, then later (arrival, id) first.
            p = p[key[p].argsort(kind="stable")[::-1]]
            p = p[vlt[p].argsort(kind="stable")]
        return c, p

    def by_arrival(self, rows: IntArray) -> IntArray:
        if rows.size < 2:
            return rows
        ordered: IntArray = rows[self.arrival_id_rank[rows].argsort(kind="stable")]
        return ordered


def arrival_id_ranks(arrival_s: FloatArray, ids: list[str]) -> RankArray:
    """Each row's place in the order by (arrival absent last, id): KeyRanking's
    key (ids must be unique)."""
    by_id = np.empty(len(ids), dtype=np.int64)
    by_id[sorted(range(len(ids)), key=ids.__getitem__)] = np.arange(len(ids))
    order = np.lexsort((by_id, nan_last(arrival_s)))
    rank: RankArray = (
        np.empty(len(ids), dtype=np.uint16)
        if len(ids) <= 1 << 16
        else np.empty(len(ids), dtype=np.int64)
    )
    rank[order] = np.arange(len(ids))
    return rank


def virtual_lag_time(cols: RotationColumns, now_s: float, inputs: RotationInputs) -> FloatArray:
    """VLT of every request at now_s.

    ROTARY: alpha * relu(now - t_last_token - beta_tbt * slo_tbt);
    WAITING: relu(now - t_arrival - beta_ttft * slo_ttft);
    RUNNING: -(now - t_run_start).
    """
    p = inputs.params
    ttft = np.where(np.isnan(cols.slo_ttft_s), inputs.slo.ttft_s, cols.slo_ttft_s)
    tbt = np.where(np.isnan(cols.slo_tbt_s), inputs.slo.tbt_s, cols.slo_tbt_s)
    waiting = np.maximum(now_s - cols.arrival_s - p.beta_ttft * ttft, 0.0)
    rotary = p.alpha * np.maximum(now_s - cols.last_token_s - p.beta_tbt * tbt, 0.0)
    running = cols.run_start_s - now_s
    state = cols.state
    vlt: FloatArray = np.where(
        state == WAITING, waiting, np.where(state == ROTARY, rotary, running)
    )
    return vlt


def _grouped_lag_and_need(
    cols: RotationColumns, now_s: float, inputs: RotationInputs, grouped: tuple[int, int]
) -> tuple[FloatArray, IntArray]:
    """virtual_lag_time and blocks_needed of columns whose rows come grouped
    by state: WAITING in [0, a), RUNNING in [a, b), ROTARY from b. Each row
    gets its state's formula (the same numbers), worked out on its group
    only."""
    a, b = grouped
    n = len(cols.state)
    p = inputs.params
    vlt = np.empty(n)
    need = np.zeros(n, dtype=np.int64)
    if a:
        ttft = cols.slo_ttft_s[:a]
        ttft = np.where(np.isnan(ttft), inputs.slo.ttft_s, ttft)
        np.maximum(now_s - cols.arrival_s[:a] - p.beta_ttft * ttft, 0.0, out=vlt[:a])
        np.add(cols.prompt_blocks[:a], 1, out=need[:a])
    if b > a:
        np.subtract(cols.run_start_s[a:b], now_s, out=vlt[a:b])
    if n > b:
        tbt = cols.slo_tbt_s[b:]
        tbt = np.where(np.isnan(tbt), inputs.slo.tbt_s, tbt)
        np.multiply(
            p.alpha, np.maximum(now_s - cols.last_token_s[b:] - p.beta_tbt * tbt, 0.0), out=vlt[b:]
        )
        need[b:] = cols.cpu_blocks[b:]
    return vlt, need


def blocks_needed(cols: RotationColumns) -> IntArray:
    """GPU blocks a request needs to run: its prompt plus one for the first
    decode (WAITING), its CPU-resident blocks (ROTARY), none (RUNNING)."""
    need: IntArray = np.where(
        cols.state == WAITING,
        cols.prompt_blocks + 1,
        np.where(cols.state == ROTARY, cols.cpu_blocks, 0),
    )
    return need


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


def greedy_fit(needs: IntArray, capacity: int) -> tuple[BoolArray, int]:
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
class Preemption:
    rows: IntArray
    freed_blocks: int
    cpu_full_skipped: IntArray


_NO_PREEMPTION = Preemption(_EMPTY, 0, _EMPTY)


def preempt_from_tail(
    cols: RotationColumns,
    candidates: IntArray,
    swap_blocks: int,
    cpu_room: int | None,
) -> Preemption:
    """Preempt candidates (already ordered tail first) until swap_blocks are
    freed. A candidate whose DIRTY blocks do not fit in cpu_room is skipped."""
    if swap_blocks <= 0 or candidates.size == 0:
        return _NO_PREEMPTION
    gpu = cols.gpu_blocks[candidates]
    dirty = gpu - cols.synced_blocks[candidates] if cpu_room is not None else None
    if cpu_room is None or dirty is None or (dirty.sum() <= cpu_room and dirty.min() >= 0):
        # Every candidate's DIRTY blocks fit (greedy_fit would take them all).
        freed = gpu.cumsum()
        walked = min(int(freed.searchsorted(swap_blocks, side="left")) + 1, candidates.size)
        return Preemption(candidates[:walked], int(freed[walked - 1]), _EMPTY)
    fits, _ = greedy_fit(dirty, cpu_room)
    freed = np.where(fits, gpu, 0).cumsum()
    # The walk stops at the candidate whose blocks cover swap_blocks.
    walked = min(int(freed.searchsorted(swap_blocks, side="left")) + 1, candidates.size)
    fits, candidates = fits[:walked], candidates[:walked]
    return Preemption(candidates[fits], int(freed[walked - 1]), candidates[~fits])


@dataclass(frozen=True, slots=True)
class Decision:
    """Largest-VLT-First's choice, as rows of the columns."""

    fallback: bool
    # In priority order, before swap-ins the transfers defer are dropped.
    prioritized: IntArray
    preemption: Preemption
    trimmed: IntArray
    budget: int
    budget_source: BudgetSource
    blocks_needed: int
    blocks_left: int
    swap_blocks_needed: int
    unmet_swap_blocks: int
    # Per row; None when no row is WAITING or ROTARY (nothing to rank).
    vlt: FloatArray | None
    need: IntArray | None
    # Which rows are RUNNING (read-only: shared with count_transfers); None
    # when every row is.
    running: BoolArray | None


def decide(
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
            _EMPTY,
            _NO_PREEMPTION,
            _EMPTY,
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
            _EMPTY,
            _NO_PREEMPTION,
            _EMPTY,
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
        vlt, need = _grouped_lag_and_need(cols, pools.now_s, inputs, grouped)
    else:
        vlt = virtual_lag_time(cols, pools.now_s, inputs)
        need = blocks_needed(cols)
    total_needed = int(need[inactive].sum())

    if free >= total_needed:
        return Decision(
            fallback=True,
            prioritized=ranking.by_arrival(inactive),
            preemption=_NO_PREEMPTION,
            trimmed=_EMPTY,
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
    trimmed = _EMPTY
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


def count_transfers(
    cols: RotationColumns, pools: Pools, inputs: RotationInputs, decision: Decision
) -> TransferPlan:
    """DuplexKV at count level (no block ids): a preempted request's SYNCED
    blocks are released at once and its DIRTY ones copied out; prioritized
    ROTARY requests are copied in, in order, while they fit in the free
    blocks plus those released (the rest are deferred); newly full blocks of
    the running requests left are copied out eagerly within the eager budget
    and the CPU blocks the swap-outs leave."""
    t = cols
    preempted = decision.preemption.rows
    prioritized = decision.prioritized
    if preempted.size:
        released = int(t.synced_blocks[preempted].sum())
        swap_out = int(t.gpu_blocks[preempted].sum()) - released
    else:
        released = swap_out = 0
    swap_in = 0
    deferred = _EMPTY
    if prioritized.size:
        swap_in_rows = prioritized[t.state[prioritized] == ROTARY]
        if swap_in_rows.size:
            sizes = t.cpu_blocks[swap_in_rows]
            room = pools.free_gpu_blocks + released
            total = int(sizes.sum())
            if total <= room and int(sizes.min()) >= 0:
                swap_in = total
            else:
                fits = _fit_in_order(sizes.tolist(), room)
                swap_in = int(sizes[fits].sum())
                deferred = swap_in_rows[~fits]
    given = inputs.params.eager_budget_blocks
    eager_room = given if given is not None else max(decision.budget - swap_out, 0)
    if pools.free_cpu_blocks is not None:
        eager_room = min(eager_room, pools.free_cpu_blocks - swap_out)
    if decision.vlt is None and not preempted.size:
        # Every row RUNNING, none preempted.
        fresh = int(np.maximum(t.full_blocks - t.synced_blocks, 0).sum())
    else:
        running = decision.running if decision.running is not None else t.state == RUNNING
        if preempted.size:
            running = running.copy()
            running[preempted] = False
        fresh = int(np.maximum(t.full_blocks[running] - t.synced_blocks[running], 0).sum())
    return TransferPlan(
        swap_in_blocks=swap_in,
        swap_out_blocks=swap_out,
        eager_blocks=max(min(fresh, eager_room), 0),
        blocks_released_now=released,
        blocks_freed_after_d2h=swap_out,
        deferred_rows=deferred,
    )


def _fit_in_order(sizes: list[int], capacity: int) -> BoolArray:
    fits = np.zeros(len(sizes), dtype=np.bool_)
    for i, size in enumerate(sizes):
        if size <= capacity:
            fits[i] = True
            capacity -= size
    return fits


@dataclass(frozen=True, slots=True)
class RowPlan:
    """What an engine carries out: rows of the columns."""

    # Preempted (by swap), in order.
    preempted: IntArray
    # Admitted or resumed, in priority order (deferred swap-ins left out).
    prioritized: IntArray
    eager_blocks: int


def plan_rows(
    cols: RotationColumns,
    pools: Pools,
    inputs: RotationInputs,
    ranking: Ranking,
    grouped: tuple[int, int] | None = None,
) -> RowPlan:
    """plan_rotation at count level, as rows: the engine's entry point (see
    decide for grouped)."""
    decision = decide(cols, pools, inputs, ranking, grouped)
    transfers = count_transfers(cols, pools, inputs, decision)
    prioritized = decision.prioritized
    if transfers.deferred_rows.size:
        prioritized = prioritized[~np.isin(prioritized, transfers.deferred_rows)]
    return RowPlan(decision.preemption.rows, prioritized, transfers.eager_blocks)
