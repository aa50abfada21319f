"""Largest-VLT-First with bounded rotation, the default `lvf` (DESIGN.md §3.1).

The ranking is the paper's: Virtual Lag Time, descending. What changes is
what a decision may spend and who may displace whom:

- **Every block moved is charged** to one per-iteration link budget
  (planner.policies.rotation_budget): swap-ins, the DIRTY blocks of
  swap-outs, and (in count_transfers) the eager copies. A rotary request
  whose blocks do not fit in what is left of the H2D budget waits for the
  next iteration.
- **Only lagging requests displace running ones.** A waiting request may
  have a running one preempted for it only once it is past its tolerance
  (VLT > 0) and can still meet its TTFT SLO; a rotary request only once its
  TPOT slack has fallen to `resume_slack_tbts` TBT SLOs. Others take free
  blocks only.
- **Only requests with slack to spare are displaced.** A running request is
  a victim only with at least `preempt_slack_tbts` TBT SLOs of TPOT slack
  (first token + slo_tbt x tokens generated - now): it can sit out for the
  gap between the two thresholds and still have a mean time per output
  token within its SLO. A request whose slack is unknown (the engine sent
  no first-token time or token count) is never a victim. Victims are taken
  from the tail of the VLT order (longest running first), as in the paper.
- **The engine's limits count.** Waiting requests the engine cannot start
  this iteration (its token budget or running-request cap is spent) are not
  prioritized, so nothing is preempted for them.

With no KV contention every startable request is admitted in arrival order
(FCFS), swap-ins within the link budget. Under lasting pressure with no
victim to spare, nothing is preempted and the queue waits, as under FCFS.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from planner.domain.rotation import Held, RotationInputs
from planner.policies.rotation_budget import LinkUse, link_budget
from planner.policies.rotation_columns import (
    EMPTY_ROWS,
    RUNNING,
    WAITING,
    BoolArray,
    Decision,
    FloatArray,
    IntArray,
    Pools,
    Preemption,
    Ranking,
    RotationColumns,
    blocks_needed,
    grouped_lag_and_need,
    virtual_lag_time,
)


def tpot_slack_s(cols: RotationColumns, now_s: float, inputs: RotationInputs) -> FloatArray:
    """How long each request may go without a token and keep its mean time
    per output token within its TBT SLO: first token + slo_tbt x tokens
    generated - now. NaN where the first token time or the count is unknown
    (or no token came yet)."""
    tbt = np.where(np.isnan(cols.slo_tbt_s), inputs.slo.tbt_s, cols.slo_tbt_s)
    generated = cols.output_tokens
    slack: FloatArray = np.where(
        generated >= 1, cols.first_token_s + tbt * generated - now_s, math.nan
    )
    return slack


def _running_tokens(cols: RotationColumns, running: BoolArray) -> int:
    """Tokens the running requests take from this iteration's budget: one
    decode each, or what is left of an unfinished prefill."""
    prefill = cols.prefill_tokens[running]
    done = cols.num_tokens[running]
    left = np.where((prefill >= 0) & (done >= 0), prefill - done, 1)
    return int(np.maximum(left, 1).sum())


def _waiting_tokens(cols: RotationColumns, block_size_tokens: int) -> IntArray:
    """Prefill tokens each request would take if admitted now (its prompt
    blocks' worth where the engine did not say)."""
    prefill = np.where(
        cols.prefill_tokens >= 0, cols.prefill_tokens, cols.prompt_blocks * block_size_tokens
    )
    left: IntArray = np.maximum(prefill - np.maximum(cols.num_tokens, 0), 1)
    return left


def decide_bounded(
    cols: RotationColumns,
    pools: Pools,
    inputs: RotationInputs,
    ranking: Ranking,
    grouped: tuple[int, int] | None = None,
) -> Decision:
    """One iteration of the bounded Largest-VLT-First (module docstring).
    grouped: as rotation_paper.decide_paper's (saves work only)."""
    use = LinkUse(link_budget(pools.last_iteration_s, pools.block_size_tokens, inputs))
    budget = use.budget
    state = cols.state
    free = pools.free_gpu_blocks
    all_running = grouped is not None and grouped[0] == 0 and grouped[1] == len(state)
    running = None if all_running else state == RUNNING
    inactive = EMPTY_ROWS if running is None else (~running).nonzero()[0]
    if not inactive.size and free >= 0:
        # Nobody to admit or resume: no contention, nothing to rank.
        return _nothing_to_rank(use, free, running)
    assert running is not None
    if grouped is not None:
        vlt, need = grouped_lag_and_need(cols, pools.now_s, inputs, grouped)
    else:
        vlt = virtual_lag_time(cols, pools.now_s, inputs)
        need = blocks_needed(cols)
    total_needed = int(need[inactive].sum())
    fallback = free >= total_needed
    p = inputs.params
    tbt = np.where(np.isnan(cols.slo_tbt_s), inputs.slo.tbt_s, cols.slo_tbt_s)
    if fallback:
        order, victims = ranking.by_arrival(inactive), EMPTY_ROWS
        urgent = lost = np.zeros(len(state), dtype=np.bool_)
    else:
        slack = tpot_slack_s(cols, pools.now_s, inputs)
        spare = slack >= p.preempt_slack_tbts * tbt
        lost = (
            slack < -p.lost_slack_tbts * tbt
            if p.lost_slack_tbts is not None
            else np.zeros(len(state), dtype=np.bool_)
        )
        order, victims = ranking.by_lag(vlt, ~running, running & (vlt < 0) & (spare | lost))
        ttft = np.where(np.isnan(cols.slo_ttft_s), inputs.slo.ttft_s, cols.slo_ttft_s)
        urgent = np.where(
            state == WAITING,
            (vlt > 0) & (pools.now_s - cols.arrival_s < ttft),
            ~(slack > p.resume_slack_tbts * tbt) & ~lost,
        )
    slots = math.inf if pools.max_running is None else pools.max_running - int(running.sum())
    room = (
        math.inf
        if pools.max_batched_tokens is None
        else pools.max_batched_tokens - _running_tokens(cols, running)
    )
    walk = _Walk(cols, pools, use, victims, lost)
    tokens = _waiting_tokens(cols, pools.block_size_tokens) if pools.max_batched_tokens else None
    prioritized: list[int] = []
    engine_full = link_full = not_lagging = no_victim = 0
    ordered_need = need[order]
    needs = ordered_need.tolist()
    is_waiting = (state[order] == WAITING).tolist()
    is_urgent = urgent[order].tolist()
    # The least any candidate from position i on needs: once nothing left
    # could fit, the rest are only counted.
    least_from = np.minimum.accumulate(ordered_need[::-1])[::-1].tolist()
    reach_all = walk.reach
    for i, (row, n, waiting) in enumerate(zip(order.tolist(), needs, is_waiting, strict=True)):
        if slots <= 0:
            engine_full += len(order) - i
            break
        free_now, free_later = walk.free_now, walk.free_later
        if least_from[i] > free_now + free_later + reach_all[True, True]:
            rest = _count_rest(
                order[i:],
                ordered_need[i:],
                state=state,
                urgent=urgent,
                room=room,
                use=use,
                fallback=fallback,
            )
            engine_full, link_full = engine_full + rest[0], link_full + rest[1]
            not_lagging, no_victim = not_lagging + rest[2], no_victim + rest[3]
            break
        if waiting:
            if room <= 0:
                engine_full += 1
                continue
            h2d = 0
            usable = free_now + free_later
        else:
            h2d = n
            if not use.fits_swap_in(h2d):
                link_full += 1
                continue
            usable = free_now
        if n > usable:
            if fallback or not is_urgent[i]:
                not_lagging += 1
                continue
            # Taking a lost request's place costs nothing in goodput only
            # when the newcomer's prefill fits in this iteration's token
            # budget: a longer one stretches the iterations of every running
            # request, and under compute pressure that makes more lost ones.
            take_lost = not waiting or tokens is None or int(tokens[row]) <= room
            if not walk.make_room(n, waiting, h2d, take_lost):
                no_victim += 1
                continue
        walk.take(n, waiting, h2d)
        prioritized.append(row)
        slots -= 1
        if waiting and tokens is not None:
            room -= int(tokens[row])
    taken = np.array(prioritized, dtype=np.int64) if prioritized else EMPTY_ROWS
    preempted = np.array(walk.preempted, dtype=np.int64) if walk.preempted else EMPTY_ROWS
    freed = int(cols.gpu_blocks[preempted].sum()) if preempted.size else 0
    skipped = np.array(walk.cpu_full, dtype=np.int64) if walk.cpu_full else EMPTY_ROWS
    return Decision(
        fallback=fallback,
        prioritized=taken,
        preemption=Preemption(preempted, freed, skipped),
        trimmed=EMPTY_ROWS,
        budget=budget.blocks,
        budget_source=budget.source,
        blocks_needed=total_needed,
        blocks_left=walk.free_now + walk.free_later,
        swap_blocks_needed=freed,
        unmet_swap_blocks=0,
        vlt=vlt,
        need=need,
        running=running,
        link=use,
        held=Held(engine_full, link_full, not_lagging, no_victim),
    )


def _count_rest(
    rows: IntArray,
    needs: IntArray,
    *,
    state: npt.NDArray[np.int8],
    urgent: BoolArray,
    room: float,
    use: LinkUse,
    fallback: bool,
) -> Held:
    """Why the candidates rows, none of which fits any more, are left out
    (as the walk would count them one by one)."""
    waiting = state[rows] == WAITING
    engine = waiting & (room <= 0)
    link = ~waiting & ~use.swap_ins_fit(needs)
    rest = ~engine & ~link
    lagging = rest & urgent[rows] if not fallback else np.zeros(len(rows), dtype=np.bool_)
    return Held(
        int(engine.sum()),
        int(link.sum()),
        int((rest & ~lagging).sum()),
        int(lagging.sum()),
    )


def _nothing_to_rank(use: LinkUse, free: int, running: BoolArray | None) -> Decision:
    return Decision(
        fallback=True,
        prioritized=EMPTY_ROWS,
        preemption=Preemption(EMPTY_ROWS, 0, EMPTY_ROWS),
        trimmed=EMPTY_ROWS,
        budget=use.budget.blocks,
        budget_source=use.budget.source,
        blocks_needed=0,
        blocks_left=free,
        swap_blocks_needed=0,
        unmet_swap_blocks=0,
        vlt=None,
        need=None,
        running=running,
        link=use,
        held=Held(),
    )


class _Walk:
    """The blocks a decision has to hand out as it walks the candidates.

    free_now: free GPU blocks, plus the SYNCED blocks of victims (released
    at once); free_later: victims' DIRTY blocks, free once their D2H copy is
    done, so a swap-in may not land in them this iteration (DuplexKV's
    race-free rule) while an admission may. Victims are taken in order,
    each once; one whose DIRTY blocks the CPU pool cannot take is passed
    over for good (it only shrinks), one the link cannot take this time or
    one whose TPOT SLO is lost (when the candidate may not take those) stays
    for later candidates."""

    def __init__(
        self,
        cols: RotationColumns,
        pools: Pools,
        use: LinkUse,
        victims: IntArray,
        lost: BoolArray,
    ) -> None:
        self.use = use
        self.free_now = pools.free_gpu_blocks
        self.free_later = 0
        self.cpu_left = math.inf if pools.cpu_room is None else pools.cpu_room
        self.victims = victims.tolist()
        gpu = cols.gpu_blocks[victims]
        synced = np.minimum(cols.synced_blocks[victims], gpu)
        self.synced = synced.tolist()
        self.dirty = (gpu - synced).tolist()
        self.lost = lost[victims].tolist()
        self.used = [False] * len(self.victims)
        # What the victims left could free at most, now and in all, with and
        # without the lost ones (for a quick no).
        spare = ~lost[victims]
        self.reach = {
            (True, True): int(gpu.sum()),
            (False, True): int(synced.sum()),
            (True, False): int(gpu[spare].sum()),
            (False, False): int(synced[spare].sum()),
        }
        self.preempted: list[int] = []
        self.cpu_full: list[int] = []

    def usable(self, waiting: bool) -> int:
        return self.free_now + self.free_later if waiting else self.free_now

    def make_room(self, need: int, waiting: bool, h2d: int, take_lost: bool) -> bool:
        """Preempt victims until need fits (a swap-in also needs h2d of the
        H2D budget); lost ones only with take_lost. False, with nothing
        preempted, when they cannot."""
        if need > self.usable(waiting) + self.reach[waiting, take_lost]:
            return False
        now, later, out = self.free_now, self.free_later, 0
        picked: list[int] = []
        for k in range(len(self.victims)):
            if (now + later if waiting else now) >= need:
                break
            if self.used[k] or (self.lost[k] and not take_lost):
                continue
            dirty = self.dirty[k]
            if dirty > self.cpu_left:
                self.used[k] = True
                self._drop(k)
                self.cpu_full.append(self.victims[k])
                continue
            if dirty > self.cpu_left - out or not self.use.fits_swap_in(h2d, out + dirty):
                continue
            picked.append(k)
            now += self.synced[k]
            later += dirty
            out += dirty
        if (now + later if waiting else now) < need:
            return False
        self.free_now, self.free_later = now, later
        self.use.charge(0, out)
        self.cpu_left -= out
        for k in picked:
            self.used[k] = True
            self._drop(k)
            self.preempted.append(self.victims[k])
        return True

    def _drop(self, k: int) -> None:
        """Victim k is no longer available."""
        gpu = self.synced[k] + self.dirty[k]
        for waiting, take_lost in self.reach:
            if take_lost or not self.lost[k]:
                self.reach[waiting, take_lost] -= gpu if waiting else self.synced[k]

    def take(self, need: int, waiting: bool, h2d: int) -> None:
        if not waiting:
            self.free_now -= need
            self.use.h2d_blocks += h2d
        elif need <= self.free_later:
            self.free_later -= need
        else:
            self.free_now -= need - self.free_later
            self.free_later = 0
