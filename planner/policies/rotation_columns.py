"""Largest-VLT-First on columns (DESIGN.md §3.1): the decision as row indices,
with its DuplexKV transfer amounts at count level.

What both variants share: the columns a decision reads, the rankings, VLT,
the Decision itself and DuplexKV at count level (`count_transfers`). The
decisions are planner.policies.rotation_paper (Algorithm 1, `lvf-paper`)
and planner.policies.rotation_bounded (`lvf`); planner.policies.
rotation_decide picks one. `plan_rotation` (planner.policies.rotation, what
the gRPC service calls) runs it on a snapshot's table and dresses the result
up as a RotationPlan; the replay engine runs it on columns it gathers from
its own state, without building ids, decisions or a summary it would not
read.

Orderings are deterministic: VLT descending, then earlier arrival (absent
last), then id. A `TableRanking` sorts by those keys (ids compared as
strings, only where every other key ties); a `KeyRanking` uses a
precomputed integer per row that orders like (arrival, id), valid when ids
are unique. With unique ids both give the same orders: the keys then order
rows strictly, so a subset sorted on its own is in the order the whole table
sorted would give it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from planner.domain.requests import RequestState
from planner.domain.rotation import BudgetSource, Held, RotationInputs
from planner.policies.duplexkv import TransferPlan
from planner.policies.ordering import nan_last, order_rows
from planner.policies.rotation_budget import LinkUse

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

EMPTY_ROWS: IntArray = np.zeros(0, dtype=np.int64)
EMPTY_ROWS.flags.writeable = False


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
    # Read by the bounded LVF only; -1 (NaN for times) where unknown.
    @property
    def num_tokens(self) -> IntArray: ...
    @property
    def prefill_tokens(self) -> IntArray: ...
    @property
    def output_tokens(self) -> IntArray: ...
    @property
    def first_token_s(self) -> FloatArray: ...


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
    # The engine's per-iteration token budget and running-request cap, if
    # known (the bounded LVF does not prioritize what the engine cannot
    # start this iteration).
    max_batched_tokens: int | None = None
    max_running: int | None = None


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


def grouped_lag_and_need(
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


NO_PREEMPTION = Preemption(EMPTY_ROWS, 0, EMPTY_ROWS)


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
    # The bounded LVF's link budget and what it charged to it (swap-ins and
    # swap-outs; count_transfers adds the eager copies), and why candidates
    # were left out. None for the paper's Algorithm 1.
    link: LinkUse | None = None
    held: Held | None = None


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
    deferred = EMPTY_ROWS
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
    if decision.link is not None:
        # The swap-outs are charged already; eager copies take what is left.
        left = decision.link.d2h_left()
        eager_room = left if given is None else min(given, left)
    else:
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
