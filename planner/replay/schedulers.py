"""The scheduling policies a replay compares. Each looks at the engine's
state once per iteration and says who to admit, resume, preempt; the engine
carries it out. `lvf` calls the rotation policy the service runs
(planner.policies.rotation.plan_rotation), on a snapshot built exactly as an
engine adapter would build it.

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
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from planner.domain.requests import RequestState, Snapshot, table_from_columns
from planner.domain.rotation import RotationInputs
from planner.policies.rotation import plan_rotation
from planner.replay.state import SimRequest


@dataclass(slots=True)
class SchedulePlan:
    swap_out: list[SimRequest] = field(default_factory=list)
    recompute: list[SimRequest] = field(default_factory=list)
    # In priority order; each is admitted (QUEUED) or resumed (ROTARY) if it fits.
    start: list[SimRequest] = field(default_factory=list)
    eager_blocks: int = 0


@dataclass(frozen=True, slots=True)
class EngineView:
    """What a scheduler may read. Lists are in the engine's order: queued by
    queue position, running by admission, rotary by preemption time."""

    now_s: float
    queued: list[SimRequest]
    running: list[SimRequest]
    rotary: list[SimRequest]
    free_gpu_blocks: int
    free_cpu_blocks: int
    block_size_tokens: int
    last_iteration_s: float


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

    def plan(self, view: EngineView) -> SchedulePlan: ...


def blocks_needed(r: SimRequest, block_size: int) -> int:
    """GPU blocks a queued request needs to start, or a rotary one to resume:
    its whole prefill while it has one to do; else its KV plus the token its
    next decode writes (resumed into just the blocks it had, a request whose
    KV ends on a block boundary would be preempted again at once)."""
    if r.kv_tokens < r.prefill_target:
        return max(-(-r.prefill_target // block_size), 1)
    return -(-(r.kv_tokens + 1) // block_size)


class Fcfs:
    name = "fcfs"
    swaps = False
    keeps_cpu_copies = False
    in_order = True

    def plan(self, view: EngineView) -> SchedulePlan:
        return SchedulePlan(start=list(view.queued))


class WaitingFirst:
    name = "waiting-first"
    swaps = True
    keeps_cpu_copies = False
    in_order = True

    def plan(self, view: EngineView) -> SchedulePlan:
        bs = view.block_size_tokens
        plan = SchedulePlan()
        free = view.free_gpu_blocks
        cpu = view.free_cpu_blocks
        victims = list(reversed(view.running))
        for r in view.queued:
            need = blocks_needed(r, bs)
            # Victims are taken only when they make room for r: swapping out
            # requests that still leave r waiting would gain nothing.
            chosen: list[SimRequest] = []
            room, cpu_left = free, cpu
            while need > room and victims:
                v = victims.pop(0)
                if v.gpu_blocks > cpu_left:
                    continue
                chosen.append(v)
                cpu_left -= v.gpu_blocks
                room += v.gpu_blocks
            if need > room:
                break
            plan.swap_out.extend(chosen)
            cpu = cpu_left
            plan.start.append(r)
            free = room - need
        if not view.queued or len(plan.start) == len(view.queued):
            plan.start.extend(view.rotary)
        return plan


class SwappedFirst:
    name = "swapped-first"
    swaps = True
    keeps_cpu_copies = False
    in_order = True

    def plan(self, view: EngineView) -> SchedulePlan:
        bs = view.block_size_tokens
        plan = SchedulePlan(start=list(view.rotary))
        resumed = sum(blocks_needed(r, bs) for r in view.rotary)
        if resumed <= view.free_gpu_blocks:
            plan.start.extend(view.queued)
        return plan


@dataclass
class Lvf:
    inputs: RotationInputs
    name: str = "lvf"
    swaps: bool = True
    keeps_cpu_copies: bool = True
    in_order: bool = False

    def plan(self, view: EngineView) -> SchedulePlan:
        """The snapshot an adapter would send, built column by column (this
        runs every simulated iteration)."""
        bs = view.block_size_tokens
        queued, running, rotary = view.queued, view.running, view.rotary
        tracked = [*queued, *running, *rotary]
        n, q, r_end = len(tracked), len(queued), len(queued) + len(running)
        nan = math.nan
        state = np.repeat(
            np.array([RequestState.WAITING, RequestState.RUNNING, RequestState.ROTARY], np.int8),
            [len(queued), len(running), len(rotary)],
        )
        run_start = np.full(n, nan)
        run_start[q:r_end] = [r.run_start_s for r in running]
        last_token = np.full(n, nan)
        last_token[r_end:] = [_last_token_s(r) for r in rotary]
        prompt_blocks = np.zeros(n, np.int64)
        prompt_blocks[:q] = [max(-(-r.prefill_target // bs), 1) for r in queued]
        gpu_blocks = np.zeros(n, np.int64)
        gpu_blocks[q:r_end] = [r.gpu_blocks for r in running]
        cpu_blocks = np.zeros(n, np.int64)
        cpu_blocks[r_end:] = [blocks_needed(r, bs) for r in rotary]
        num_tokens = np.full(n, -1, np.int64)
        num_tokens[q:r_end] = [r.kv_tokens for r in running]
        synced = np.zeros(n, np.int64)
        synced[q:r_end] = [r.synced_blocks for r in running]
        table = table_from_columns(
            [r.id for r in tracked],
            state=state,
            arrival_s=np.array([r.arrival_s for r in tracked], np.float64),
            run_start_s=run_start,
            last_token_s=last_token,
            prompt_blocks=prompt_blocks,
            gpu_blocks=gpu_blocks,
            cpu_blocks=cpu_blocks,
            num_tokens=num_tokens,
            synced_blocks=synced,
            slo_ttft_s=np.array([r.slo_ttft_s for r in tracked], np.float64),
            slo_tbt_s=np.array([r.slo_tbt_s for r in tracked], np.float64),
            block_size_tokens=bs,
        )
        snapshot = Snapshot(
            now_s=view.now_s,
            free_gpu_blocks=view.free_gpu_blocks,
            requests=table,
            block_size_tokens=bs,
            free_cpu_blocks=view.free_cpu_blocks,
            last_iteration_s=view.last_iteration_s if view.last_iteration_s > 0 else None,
        )
        decision = plan_rotation(snapshot, self.inputs)
        by_id = {r.id: r for r in tracked}
        return SchedulePlan(
            swap_out=[by_id[d.id] for d in decision.preempted],
            start=[by_id[d.id] for d in decision.prioritized],
            eager_blocks=decision.explanation.eager_blocks,
        )


def _last_token_s(r: SimRequest) -> float:
    """When a rotary request last made progress: its latest token, else its
    latest prefill chunk (preempted mid-prefill), else its arrival. Never NaN:
    a NaN VLT would never be picked again."""
    if r.outcome.token_times_s:
        return r.outcome.token_times_s[-1]
    if not math.isnan(r.last_progress_s):
        return r.last_progress_s
    return r.arrival_s


POLICY_NAMES = ("fcfs", "lvf", "waiting-first", "swapped-first")


def make_scheduler(name: str, inputs: RotationInputs) -> Scheduler:
    if name == "fcfs":
        return Fcfs()
    if name == "lvf":
        return Lvf(inputs)
    if name == "waiting-first":
        return WaitingFirst()
    if name == "swapped-first":
        return SwappedFirst()
    raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICY_NAMES)})")
