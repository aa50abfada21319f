"""Model residency, the strategy of a MIG slice's batching core
(planner.replay.batching_core) in the serverless topology: both the core's
scheduler and its KV residency (planner.replay.kv_residency), as the
long-context topology's FinalLengthAdmission and LayerResidency are.

Several models may be set up on one slice, taking turns. plan() picks this
iteration's turn (planner.policies.serverless.next_turn: the resident whose
requests must run first, by their deadlines less the prefill they have
left; ties round robin) and makes its KV moves on the core: while the
turn's decodes' growth does not fit the slice's KV room, its youngest
running request swaps out (its KV to host memory at the link's full rate,
to the front of the model's queue; counted as a swap, not a preemption);
requests at the queue's front whose KV is in host memory swap back in while
they fit (at the slice's share of the link: the request is ready then, the
iteration is not stalled); the queue's head prefills when its chunk fits,
admitted to the core if it is new to the slice. A request that fits not
even alone on the slice is rejected. runs() names the running requests
that run, the turn's ready decodes and its one prefilling request (its
chunk is the request's own chunk_tokens), the core holding back the rest;
timed() times the pass by the wiring's cost model (weights partly
resident, the rest streamed over the link the slices share) in place of
the core's compute and link terms; emitted() moves a finished prefill
into the model's running requests.

KV is counted in tokens. The core's block pool (one-token blocks) never
limits: the slice's KV room is its HBM less the resident weights
(Slice.kv_capacity), which the wiring may grow by dropping resident weights
(make_room), and a prefill reserves a chunk at a time, where the core
would reserve the whole prompt at admission."""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np

from planner.policies.serverless import next_turn
from planner.profiles.mig import GB
from planner.replay.batch import Batch
from planner.replay.engine_state import FINISHED, QUEUED, EngineState
from planner.replay.kv_residency import ResidentIteration
from planner.replay.schedulers import NO_PLAN, EngineView, SchedulePlan
from planner.replay.serverless_slices import NOBODY, Resident, Slice, SlicedRequest
from planner.replay.state import IntArray


class Turn(NamedTuple):
    """The resident that runs this iteration (NOBODY: none), the request it
    prefills (if any) and its ready decodes."""

    resident: Resident
    head: SlicedRequest | None
    decodes: list[SlicedRequest]


NO_TURN = Turn(NOBODY, None, [])


class Pass(NamedTuple):
    """One iteration's pass as the cost model sees it: its prefill chunk,
    the decodes' context (prompt plus generated tokens each) and the
    prefill's start (its tokens already prefilled)."""

    chunk: int
    context: int
    start: int


class SliceTurns(Protocol):
    """What model residency asks the serverless wiring."""

    def link_share_gbps(self, s: Slice) -> float:
        """The link bandwidth a pass on ``s`` gets now (GB/s)."""
        ...

    def chunk_of(self, s: Slice, r: Resident, prompt_tokens: int) -> int:
        """The prefill chunk of a request of ``r`` with that prompt."""
        ...

    def prefill_s_per_token(self, s: Slice) -> float:
        """A prefill's seconds per prompt token on ``s`` (what a deadline
        is brought forward by for the prompt left)."""
        ...

    def make_room(
        self,
        s: Slice,
        tokens: int,
        r: Resident,
        with_room: list[SlicedRequest],
        without: list[SlicedRequest],
        *,
        judged_tokens: int = 0,
    ) -> bool:
        """Whether ``s``'s KV room now holds ``tokens``, resident weights
        dropped for it if the policy lets them go (``with_room`` and
        ``without``: ``r``'s decodes either way)."""
        ...

    def moved_in(self, kv_bytes: float) -> None:
        """KV bytes moved back in over the link."""
        ...

    def pass_s(self, s: Slice, turn: Turn, work: Pass, now_s: float) -> float:
        """Seconds the turn's pass takes from now_s (the cost model, the
        link share, the noise), its counters and knobs updated."""
        ...


class ModelResidency:
    """A slice's scheduler and KV residency (see the module doc)."""

    name = "model-residency"
    swaps = True
    keeps_cpu_copies = False
    in_order = True
    idle_unless_waiting = False
    copies_only_unless_waiting = False
    running_first = False
    starts_queue_only = False
    # Its slice, once bound (the slice's core is built with it).
    slice: Slice

    def __init__(
        self, turns: SliceTurns, *, max_running: int, kv_token_bytes: float, link_gbps: float
    ) -> None:
        self._turns = turns
        self._max_running = max_running
        self._kv_token_bytes = kv_token_bytes
        self._link_bytes_per_s = link_gbps * GB
        self.turn = NO_TURN
        # The turn's prefill: the tokens its request had prefilled before.
        self._start = 0
        self._now_s = 0.0
        # The core's finished count before this iteration's tokens.
        self._finished = 0
        # Running requests swapped out for KV room; requests rejected.
        self.kv_swaps = 0
        self.rejected = 0

    def bind(self, s: Slice) -> None:
        self.slice = s

    # -- the core's scheduler -----------------------------------------------

    def plan(self, view: EngineView) -> SchedulePlan:
        return self.plan_at(view.now_s)

    def plan_at(self, now_s: float) -> SchedulePlan:
        turn = self._next_turn(now_s)
        self.turn = turn
        head = turn.head
        if head is not None and self.slice.core.requests.phase.item(head.row) == QUEUED:
            return SchedulePlan(start=np.array([head.row], dtype=np.int64))
        return NO_PLAN

    def _next_turn(self, now: float) -> Turn:
        """The resident to run now with its prefill head and ready decodes,
        its KV moves made; NO_TURN when no resident has tokens to run."""
        s = self.slice
        residents = s.residents
        ready = [i for i, r in enumerate(residents) if r.ready_s <= now and (r.queue or r.running)]
        if len(ready) <= 1:
            # One resident can run at most: no deadline to weigh.
            return self._turn_of(ready[0], now) if ready else NO_TURN
        per_token = self._turns.prefill_s_per_token(s)
        deadlines: list[float | None] = [None] * len(residents)
        for i in ready:
            deadlines[i] = min(q.start_by(per_token) for q in residents[i].requests)
        while (k := next_turn(deadlines, s.turn)) is not None:
            turn = self._turn_of(k, now)
            if turn is not NO_TURN:
                return turn
            deadlines[k] = None
        return NO_TURN

    def _turn_of(self, i: int, now: float) -> Turn:
        """Resident i's turn now, its KV moves made (NO_TURN: it has no
        tokens to run)."""
        s = self.slice
        r = s.residents[i]
        head = self._admit(r, now)
        decodes = [q for q in r.running if q.ready_s <= now]
        if head is None and not decodes:
            return NO_TURN
        s.turn = i
        return Turn(r, head, decodes)

    def _admit(self, r: Resident, now: float) -> SlicedRequest | None:
        """Make KV room for ``r``'s turn and pick the request to prefill: swap
        its youngest running requests out while its decodes' growth does not
        fit, move swapped requests at the front of its queue back in when
        they fit, and return its queue head when that chunk fits."""
        s = self.slice
        turns = self._turns
        cap = s.kv_capacity
        used = s.kv_used
        if used + len(r.running) > cap and turns.make_room(
            s, used + len(r.running), r, r.running, r.running[:-1]
        ):
            cap = s.kv_capacity
        state = s.core.state
        while r.running and used + len(r.running) > cap:
            q = r.running.pop()
            used -= q.kv_tokens
            q.kv_in_host = True
            q.ready_s = (
                max(q.ready_s, now) + q.kv_tokens * self._kv_token_bytes / self._link_bytes_per_s
            )
            state.preempt([q.row], swap=True, counted=False)
            r.queue.appendleft(q)
            self.kv_swaps += 1
        while r.queue:
            head = r.queue[0]
            if head.kv_in_host:
                # Its KV, then a token for it and for every decode.
                need = used + head.kv_tokens + 1 + len(r.running)
                if need > cap and turns.make_room(s, need, r, [*r.running, head], r.running):
                    cap = s.kv_capacity
                if need > cap or len(r.running) >= self._max_running:
                    if used == 0:
                        # Alone on the slice and still too big: it never fits.
                        state.reject([r.queue.popleft().row])
                        self.rejected += 1
                        continue
                    break
                moved = head.kv_tokens * self._kv_token_bytes
                head.ready_s = max(head.ready_s, now) + moved / (turns.link_share_gbps(s) * GB)
                turns.moved_in(moved)
                head.kv_in_host = False
                state.swap_in([head.row], [int(state.requests.start_blocks[head.row])], False)
                used += head.kv_tokens
            if not head.prefill_done:
                break
            r.queue.popleft()
            r.running.append(head)
        if not r.queue or len(r.running) >= self._max_running:
            return None
        head = r.queue[0]
        if head.kv_in_host or head.ready_s > now:
            return None
        if head.chunk == 0:
            head.chunk = turns.chunk_of(s, r, head.prompt_tokens)
            state.requests.chunk_tokens[head.row] = head.chunk
        chunk = min(head.chunk, head.prompt_tokens - head.prefilled)
        if used + chunk + len(r.running) > cap:
            need = used + chunk + len(r.running)
            whole = used + head.prompt_tokens - head.prefilled + len(r.running)
            if turns.make_room(s, need, r, [*r.running, head], r.running, judged_tokens=whole):
                return head
            if used == head.kv_tokens:
                # Alone on the slice and still too big: it never fits.
                state.reject([r.queue.popleft().row])
                self.rejected += 1
            return None
        return head

    # -- the core's KV residency ----------------------------------------------

    def runs(self, state: EngineState, now_s: float) -> list[int]:
        turn = self.turn
        head = turn.head
        self._now_s = now_s
        self._finished = state.finished
        if turn.resident is NOBODY:
            return []
        rows = [q.row for q in turn.decodes]
        self._start = 0
        if head is not None:
            self._start = head.prefilled
            rows.append(head.row)
        return rows

    def paused(self, state: EngineState, now_s: float) -> IntArray:
        runs = set(self.runs(state, now_s))
        held = [row for row in state.running.rows.tolist() if row not in runs]
        return np.array(held, dtype=np.int64)

    def timed(self, batch: Batch, compute_s: float) -> ResidentIteration:
        # The batch's context is each decode's KV after it (its prompt and
        # its tokens so far) and the prefill's (its start and its chunk).
        chunk = batch.prefill_tokens
        work = Pass(chunk, batch.context_tokens - self._start - chunk, self._start)
        seconds = self._turns.pass_s(self.slice, self.turn, work, self._now_s)
        return ResidentIteration(seconds, 0.0, 0, 0)

    def emitted(self, state: EngineState, batch: Batch, now_s: float) -> None:
        r, head, _ = self.turn
        phase = state.requests.phase
        r.last_used_s = now_s
        if state.finished != self._finished:
            r.running = [q for q in r.running if phase.item(q.row) != FINISHED]
        if head is not None and head.prefill_done:
            r.queue.popleft()
            if phase.item(head.row) != FINISHED:
                r.running.append(head)
