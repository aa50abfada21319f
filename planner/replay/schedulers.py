"""The scheduling policies a replay compares. Each looks at the engine's
state once per iteration and says who to admit, resume, preempt; the engine
carries it out. `lvf` runs the rotation policy the service runs (the
decision plan_rotation makes, planner.policies.rotation_columns) on the
columns of the snapshot an engine adapter would build, gathered from the
engine's own columns (no ids, decisions or summary it would not read).

- fcfs: vLLM V1's default: admit in arrival order while blocks last; when a
  running request needs a block and none is free, preempt the most recently
  admitted request by recompute (its KV is dropped; it re-queues at the head).
- waiting-first (SuperInfer §3.1, WF): admit waiting requests first, swapping
  out the most recently admitted running requests to make room; resume
  swapped requests only when nobody waits.
- swapped-first (SF): resume swapped requests first; admit waiting ones only
  when none is swapped; preempt (by swap) only when a running request needs a
  block.
- lvf: SuperInfer's Largest-VLT-First with DuplexKV eager copies.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from planner.domain.requests import RequestState, Snapshot, table_from_columns
from planner.domain.rotation import RotationInputs, RotationPlan, RotationVariant
from planner.policies.rotation import plan_rotation
from planner.policies.rotation_columns import (
    KeyRanking,
    Pools,
    RankArray,
    arrival_id_ranks,
)
from planner.policies.rotation_decide import plan_rows
from planner.replay.prefix_cache import PrefixCache
from planner.replay.state import (
    FloatArray,
    IntArray,
    PhaseArray,
    RequestColumns,
    start_candidates,
)

_NO_ROWS: IntArray = np.zeros(0, dtype=np.int64)


class SchedulePlan(NamedTuple):
    """Request rows (planner.replay.state) to act on, each listed once."""

    swap_out: IntArray = _NO_ROWS
    recompute: IntArray = _NO_ROWS
    # In priority order; each is admitted (QUEUED) or resumed (ROTARY) if it fits.
    start: IntArray = _NO_ROWS
    eager_blocks: int = 0
    # Whether the scheduler asked a planning policy for this plan (the engine
    # charges its config's planning_s_per_call to the iteration).
    asked_policy: bool = False


# The plan that does nothing: a scheduler that returns this object spares
# the engine carrying it out.
NO_PLAN = SchedulePlan()


class EngineView(NamedTuple):
    """What a scheduler may read (and must not change): every request's
    columns, and the rows of the queues in the engine's order: queued by
    queue position, running by admission, rotary by preemption time."""

    now_s: float
    requests: RequestColumns
    queued: IntArray
    running: IntArray
    rotary: IntArray
    free_gpu_blocks: int
    free_cpu_blocks: int
    block_size_tokens: int
    last_iteration_s: float
    # The engine's token budget per iteration, and how many more requests it
    # may start (its running cap less those running or being swapped in).
    max_batched_tokens: int | None = None
    free_slots: int | None = None
    # The engine's prefix cache (None: none): which GPU blocks the running
    # requests share (their gpu_blocks count a shared block once per holder).
    prefix: PrefixCache | None = None


class Scheduler(Protocol):
    name: str
    # Whether preemption keeps the request's KV in CPU memory (swap) or drops
    # it (recompute); and whether CPU copies are kept after a swap-in, so
    # full blocks are not copied out again (DuplexKV's SYNCED blocks).
    swaps: bool
    keeps_cpu_copies: bool
    # Start requests strictly in plan order, stopping at the first that does
    # not fit (vLLM's queues); False: skip it and try the next (LVF's list
    # was already fitted by the policy).
    in_order: bool
    # Plans nothing while no request is queued or rotary, so the engine may
    # run such iterations without asking.
    idle_unless_waiting: bool
    # While no request is queued, rotary or being swapped in, plans at most
    # eager copies (never a preemption or a start), so the engine may run
    # such iterations in one step, still asking it at each.
    copies_only_unless_waiting: bool
    # The running requests' decodes take the blocks they grow into this
    # iteration before anything is admitted, and nothing is admitted in an
    # iteration whose decodes force a preemption (vLLM V1's scheduler:
    # running requests first, the waiting queue only when none was
    # preempted). False: admissions first, growth after, taking its blocks
    # by preemption if need be.
    running_first: bool
    # Plans nothing but starting queued requests in queue order (never a
    # preemption, a resumption or an eager copy, and no state of its own),
    # and starts none past one the engine cannot start (in_order): while the
    # queue's head cannot start (no free slot, or fewer free blocks than it
    # needs) it would start nobody, so the engine runs such iterations
    # without asking.
    starts_queue_only: bool

    def plan(self, view: EngineView) -> SchedulePlan: ...


@runtime_checkable
class PlansFromClock(Protocol):
    """A scheduler whose plan depends on the clock alone (its own state
    holds the rest): the engine asks plan_at(now_s) without building an
    EngineView, for the same plan as plan(view)."""

    def plan_at(self, now_s: float) -> SchedulePlan: ...


class Fcfs:
    name = "fcfs"
    swaps = False
    keeps_cpu_copies = False
    in_order = True
    idle_unless_waiting = True
    copies_only_unless_waiting = False
    running_first = False
    starts_queue_only = True

    def plan(self, view: EngineView) -> SchedulePlan:
        return SchedulePlan(start=view.queued)


class FcfsVllm(Fcfs):
    """fcfs in vLLM V1's order: running requests take their blocks first,
    and no request is admitted in an iteration that preempts."""

    name = "fcfs-vllm"
    running_first = True


class WaitingFirst:
    name = "waiting-first"
    swaps = True
    keeps_cpu_copies = False
    in_order = True
    idle_unless_waiting = True
    copies_only_unless_waiting = False
    running_first = False
    starts_queue_only = False

    def plan(self, view: EngineView) -> SchedulePlan:
        """The queue's head that can start, with room made by swapping out
        victims where needed (it stops at the first it cannot make room for);
        then, if the whole queue starts, the rotary requests."""
        # Running requests as victims, most recent first; their blocks are
        # looked up once a waiting request needs room.
        victims = view.running[::-1]
        victim_blocks: IntArray | None = None
        taken = 0  # victims looked at so far (taken or passed over for good)
        swap_out: list[int] = []
        starting = 0
        free = view.free_gpu_blocks
        cpu = view.free_cpu_blocks
        for _, need, _ in start_candidates(view.requests, view.queued):
            if need <= free:
                starting += 1
                free -= need
                continue
            # Victims are taken only when they make room for this request:
            # swapping out requests that still leave it waiting would gain
            # nothing. One whose blocks the CPU pool cannot take is passed over.
            chosen: list[int] = []
            room, cpu_left = free, cpu
            if victim_blocks is None:
                victim_blocks = view.requests.gpu_blocks[victims]
            while need > room and taken < len(victims):
                fitting = (victim_blocks[taken:] <= cpu_left).nonzero()[0]
                if not len(fitting):
                    taken = len(victims)
                    break
                v = taken + int(fitting[0])
                taken = v + 1
                chosen.append(int(victims[v]))
                cpu_left -= int(victim_blocks[v])
                room += int(victim_blocks[v])
            if need > room:
                break
            swap_out.extend(chosen)
            cpu = cpu_left
            starting += 1
            free = room - need
        start = view.queued[:starting]
        if starting == len(view.queued):
            start = np.concatenate((start, view.rotary))
        return SchedulePlan(
            swap_out=np.array(swap_out, dtype=np.int64) if swap_out else _NO_ROWS, start=start
        )


class SwappedFirst:
    name = "swapped-first"
    swaps = True
    keeps_cpu_copies = False
    in_order = True
    idle_unless_waiting = True
    copies_only_unless_waiting = False
    running_first = False
    starts_queue_only = False

    def plan(self, view: EngineView) -> SchedulePlan:
        resumed = int(view.requests.start_blocks[view.rotary].sum())
        if resumed <= view.free_gpu_blocks:
            return SchedulePlan(start=np.concatenate((view.rotary, view.queued)))
        return SchedulePlan(start=view.rotary)


_STATES = np.array([RequestState.WAITING, RequestState.RUNNING, RequestState.ROTARY], np.int8)


@dataclass
class Lvf:
    """Largest-VLT-First: the rotation policy's own decision
    (planner.policies.rotation_columns, which plan_rotation runs for the
    service) on columns gathered from the engine's state. Snapshots and
    plan_rotation itself are used where ids repeat (the policy orders ties by
    id) or when `on_snapshots` names a decision on snapshots (plan_rotation,
    or a function wrapping it): the plans are the same."""

    inputs: RotationInputs
    name: str = "lvf"
    swaps: bool = True
    keeps_cpu_copies: bool = True
    in_order: bool = False
    # Its DuplexKV eager copies go on with nobody waiting, and are all it
    # plans then (nothing to admit or resume: no contention).
    idle_unless_waiting: bool = False
    copies_only_unless_waiting: bool = True
    running_first: bool = False
    starts_queue_only: bool = False
    # Decide through this function on snapshots (the service's entry point)
    # instead of on the engine's columns.
    on_snapshots: Callable[[Snapshot, RotationInputs], RotationPlan] | None = None
    # Wall seconds spent in the rotation policy itself: what a run cannot go
    # below (planner bench replay reports it).
    policy_s: float = field(default=0.0, init=False)
    # Per run: each request's place by (arrival, id), the ranking's tie-break.
    _ranks: RankArray | None = field(default=None, init=False, repr=False)
    _ranks_of: RequestColumns | None = field(default=None, init=False, repr=False)

    def plan(self, view: EngineView) -> SchedulePlan:
        r = view.requests
        if r.row_of is None or self.on_snapshots is not None:
            return self._plan_snapshot(view)
        if self._ranks_of is not r or self._ranks is None:
            self._ranks = arrival_id_ranks(r.arrival_s, r.ids)
            self._ranks_of = r
        cols = ViewColumns(view)
        rows = cols.rows
        ranking = KeyRanking(self._ranks, rows)
        started = time.perf_counter()
        decision = plan_rows(cols, rotation_pools(view), self.inputs, ranking, cols.grouped)
        self.policy_s += time.perf_counter() - started
        return SchedulePlan(
            swap_out=rows[decision.preempted] if decision.preempted.size else _NO_ROWS,
            start=rows[decision.prioritized] if decision.prioritized.size else _NO_ROWS,
            eager_blocks=decision.eager_blocks,
        )

    def _plan_snapshot(self, view: EngineView) -> SchedulePlan:
        rows, snapshot = rotation_snapshot(view)
        started = time.perf_counter()
        decide = self.on_snapshots if self.on_snapshots is not None else plan_rotation
        decision = decide(snapshot, self.inputs)
        self.policy_s += time.perf_counter() - started
        row_of = view.requests.row_of
        if row_of is None:
            # Ids repeat: the snapshot's own rows, the last of an id winning.
            row_of = dict(zip(snapshot.requests.ids, rows.tolist(), strict=True))
        return SchedulePlan(
            swap_out=np.array([row_of[d.id] for d in decision.preempted], dtype=np.int64),
            start=np.array([row_of[d.id] for d in decision.prioritized], dtype=np.int64),
            eager_blocks=decision.explanation.eager_blocks,
        )


@dataclass
class LvfAsVllmAdapter:
    """lvf as the vLLM adapter applies it with its defaults (adapters/vllm:
    plan order applied only with preemptions): the rotation policy is asked
    only while someone waits and some running request could be a victim
    (the policy's own victim rule: at least preempt_slack_tbts TBT SLOs of
    TPOT slack, or lost by more than lost_slack_tbts), and its plan is
    applied only when it preempts: its victims swap out and the requests it
    prioritizes go first, ahead of vLLM's order. Every other iteration is
    vLLM's own (fcfs-vllm): its preemptions recompute, as the adapter's
    default engine_preemptions "recompute" leaves them (swaps=True: the
    connector swaps them out, engine_preemptions "swap"), and the preempted
    requests go first in line, as vLLM puts a preempted request back at the
    head of its waiting queue. The adapter's
    one-step lag (pipelined planning: a plan made on the last step's
    snapshot) is not modelled."""

    inputs: RotationInputs
    name: str = "lvf-vllm"
    swaps: bool = False
    keeps_cpu_copies: bool = False
    in_order: bool = True
    idle_unless_waiting: bool = True
    copies_only_unless_waiting: bool = False
    running_first: bool = True
    starts_queue_only: bool = False
    # Iterations the policy was asked in, and those whose plan was applied.
    asked: int = field(default=0, init=False)
    applied: int = field(default=0, init=False)
    _lvf: Lvf = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._lvf = Lvf(self.inputs, name=self.name)

    @property
    def policy_s(self) -> float:
        return self._lvf.policy_s

    def plan(self, view: EngineView) -> SchedulePlan:
        vllm_order = np.concatenate((view.rotary[::-1], view.queued))
        if not self._any_victim(view):
            return SchedulePlan(start=vllm_order)
        self.asked += 1
        decision = self._lvf.plan(view)
        if not len(decision.swap_out):
            return SchedulePlan(start=vllm_order, asked_policy=True)
        self.applied += 1
        first = decision.start
        rest = vllm_order[~np.isin(vllm_order, first)]
        return SchedulePlan(
            swap_out=decision.swap_out, start=np.concatenate((first, rest)), asked_policy=True
        )

    def _any_victim(self, view: EngineView) -> bool:
        """Whether a running request could be a victim (adapters/common/
        victim_gate.py: the bounded lvf's rule on TPOT slack)."""
        p = self.inputs.params
        if p.variant is not RotationVariant.LVF:
            return True
        r = view.requests
        rows = view.running
        generated = r.generated[rows]
        tbt = np.where(np.isnan(r.slo_tbt_s[rows]), self.inputs.slo.tbt_s, r.slo_tbt_s[rows])
        slack = r.first_token_s[rows] + tbt * generated - view.now_s
        known = (generated >= 1) & ~np.isnan(slack)
        victim = slack >= p.preempt_slack_tbts * tbt
        if p.lost_slack_tbts is not None:
            victim |= slack < -p.lost_slack_tbts * tbt
        return bool((known & victim).any())


class ViewColumns:
    """The columns of the snapshot rotation_snapshot builds (queued, then
    running, then rotary requests; the same numbers) without ids, each
    gathered from the engine's columns when the policy first reads it (with
    nobody waiting, it reads only what the eager copies need) and kept as a
    plain attribute from then on."""

    state: PhaseArray
    arrival_s: FloatArray
    run_start_s: FloatArray
    last_token_s: FloatArray
    prompt_blocks: IntArray
    gpu_blocks: IntArray
    cpu_blocks: IntArray
    full_blocks: IntArray
    synced_blocks: IntArray
    slo_ttft_s: FloatArray
    slo_tbt_s: FloatArray
    num_tokens: IntArray
    prefill_tokens: IntArray
    output_tokens: IntArray
    first_token_s: FloatArray

    def __init__(self, view: EngineView) -> None:
        self._view = view
        self._gpu: IntArray | None = None
        q, t = len(view.queued), len(view.queued) + len(view.running)
        self._q, self._t, self._n = q, t, t + len(view.rotary)
        # Queued (WAITING) rows first, then running, then rotary.
        self.grouped = (q, t)
        # The request row of each row.
        self.rows: IntArray = (
            view.running
            if q == 0 and self._n == t
            else np.concatenate((view.queued, view.running, view.rotary))
        )

    def __getattr__(self, name: str) -> npt.NDArray[Any]:
        """A column not gathered yet: gather it (the engine column of the rows,
        or _gather_<name>) and keep it."""
        if name.startswith("_"):
            raise AttributeError(name)
        same = _SAME_ROWS.get(name)
        column: npt.NDArray[Any] = (
            getattr(self._view.requests, same)[self.rows]
            if same is not None
            else getattr(self, "_gather_" + name)()
        )
        setattr(self, name, column)
        return column

    def _by_state(
        self, queued: IntArray | None, running: IntArray | None, rotary: IntArray | None
    ) -> IntArray:
        """An integer column: the given values for each state, zero elsewhere."""
        q, t, n = self._q, self._t, self._n
        if running is not None and q == 0 and n == t:
            return running
        out = np.zeros(n, dtype=np.int64)
        if queued is not None:
            out[:q] = queued
        if running is not None:
            out[q:t] = running
        if rotary is not None:
            out[t:] = rotary
        return out

    def _times(self, running: FloatArray | None, rotary: FloatArray | None) -> FloatArray:
        q, t, n = self._q, self._t, self._n
        out = np.empty(n)
        out.fill(math.nan)
        if running is not None:
            out[q:t] = running
        if rotary is not None:
            out[t:] = rotary
        return out

    def _running_gpu(self) -> IntArray:
        if self._gpu is None:
            self._gpu = self._view.requests.gpu_blocks[self._view.running]
        return self._gpu

    def _gather_state(self) -> PhaseArray:
        q, t, n = self._q, self._t, self._n
        if q == 0 and n == t:
            return _all_running(n)
        return np.repeat(_STATES, [q, t - q, n - t])

    def _gather_run_start_s(self) -> FloatArray:
        v = self._view
        return self._times(v.requests.run_start_s[v.running], None)

    def _gather_last_token_s(self) -> FloatArray:
        v = self._view
        return self._times(None, last_progress_s(v.requests, v.rotary))

    def _gather_prompt_blocks(self) -> IntArray:
        v = self._view
        return self._by_state(v.requests.start_blocks[v.queued], None, None)

    def _gather_gpu_blocks(self) -> IntArray:
        return self._by_state(None, self._running_gpu(), None)

    def _gather_cpu_blocks(self) -> IntArray:
        v = self._view
        return self._by_state(None, None, v.requests.start_blocks[v.rotary])

    def _gather_full_blocks(self) -> IntArray:
        v = self._view
        kv = v.requests.kv_tokens[v.running]
        full: IntArray = np.minimum(kv // v.block_size_tokens, self._running_gpu())
        return self._by_state(None, full, None)

    def _gather_synced_blocks(self) -> IntArray:
        v = self._view
        synced: IntArray = np.minimum(v.requests.synced_blocks[v.running], self._running_gpu())
        return self._by_state(None, synced, None)


# Snapshot columns that are an engine column's values of the rows, each
# with the engine column's name.
_SAME_ROWS = {
    "arrival_s": "arrival_s",
    "slo_ttft_s": "slo_ttft_s",
    "slo_tbt_s": "slo_tbt_s",
    "num_tokens": "kv_tokens",
    "prefill_tokens": "prefill_target",
    "output_tokens": "generated",
    "first_token_s": "first_token_s",
}
_ALL_RUNNING: dict[int, PhaseArray] = {}


def _all_running(n: int) -> PhaseArray:
    """A read-only state column of n RUNNING rows (one per n, kept)."""
    column = _ALL_RUNNING.get(n)
    if column is None:
        column = np.full(n, _STATES[1])
        column.flags.writeable = False
        _ALL_RUNNING[n] = column
    return column


def rotation_pools(view: EngineView) -> Pools:
    """The snapshot's numbers besides the requests."""
    return Pools(
        now_s=view.now_s,
        free_gpu_blocks=view.free_gpu_blocks,
        free_cpu_blocks=view.free_cpu_blocks,
        cpu_room=view.free_cpu_blocks,
        last_iteration_s=view.last_iteration_s if view.last_iteration_s > 0 else None,
        block_size_tokens=view.block_size_tokens,
        max_batched_tokens=view.max_batched_tokens,
        max_running=_running_cap(view),
    )


def _running_cap(view: EngineView) -> int | None:
    """The running-request cap as the policy counts it: those running now
    plus the slots left."""
    return None if view.free_slots is None else len(view.running) + view.free_slots


def rotation_snapshot(view: EngineView) -> tuple[IntArray, Snapshot]:
    """The snapshot an engine adapter would send (queued, then running, then
    rotary requests) and the request row of each of its rows."""
    r, bs = view.requests, view.block_size_tokens
    queued, running, rotary = view.queued, view.running, view.rotary
    rows = np.concatenate((queued, running, rotary))
    q, t = len(queued), len(queued) + len(running)  # running at [q, t), rotary from t
    # Columns by state, zero (or NaN) where a state has no such number: one
    # block of integer columns and one of times.
    counts = np.zeros((4, len(rows)), dtype=np.int64)
    prompt_blocks, gpu_blocks, cpu_blocks, synced_blocks = counts
    prompt_blocks[:q] = r.start_blocks[queued]
    gpu_blocks[q:t] = r.gpu_blocks[running]
    synced_blocks[q:t] = r.synced_blocks[running]
    cpu_blocks[t:] = r.start_blocks[rotary]
    num_tokens = np.empty(len(rows), dtype=np.int64)
    num_tokens.fill(-1)
    num_tokens[q:t] = r.kv_tokens[running]
    times = np.empty((2, len(rows)))
    times.fill(math.nan)
    run_start_s, last_token_s = times
    run_start_s[q:t] = r.run_start_s[running]
    last_token_s[t:] = last_progress_s(r, rotary)
    table = table_from_columns(
        r.id_array[rows].tolist(),
        state=np.repeat(_STATES, [len(queued), len(running), len(rotary)]),
        arrival_s=r.arrival_s[rows],
        run_start_s=run_start_s,
        last_token_s=last_token_s,
        prompt_blocks=prompt_blocks,
        gpu_blocks=gpu_blocks,
        cpu_blocks=cpu_blocks,
        num_tokens=num_tokens,
        synced_blocks=synced_blocks,
        slo_ttft_s=r.slo_ttft_s[rows],
        slo_tbt_s=r.slo_tbt_s[rows],
        block_size_tokens=bs,
        prefill_tokens=r.prefill_target[rows],
        output_tokens=r.generated[rows],
        first_token_s=r.first_token_s[rows],
    )
    snapshot = Snapshot(
        now_s=view.now_s,
        free_gpu_blocks=view.free_gpu_blocks,
        requests=table,
        block_size_tokens=bs,
        free_cpu_blocks=view.free_cpu_blocks,
        last_iteration_s=view.last_iteration_s if view.last_iteration_s > 0 else None,
        max_batched_tokens=view.max_batched_tokens,
        max_running_requests=_running_cap(view),
    )
    return rows, snapshot


def last_progress_s(requests: RequestColumns, rows: IntArray) -> FloatArray:
    """When rotary requests last made progress: their latest token, else
    their latest prefill chunk (preempted mid-prefill), else their arrival.
    Never NaN: a NaN VLT would never be picked again."""
    token = requests.last_token_s[rows]
    when: FloatArray = np.where(np.isnan(token), requests.last_prefill_s[rows], token)
    return when
