"""Model residency, the strategy of a MIG slice's batching core
(planner.replay.batching_core) in the serverless topology: both the core's
scheduler and its KV residency (planner.replay.kv_residency), as the
long-context topology's FinalLengthAdmission and LayerResidency are.

Several models may be set up on one slice, taking turns: each iteration
runs one of them (the wiring's turn: earliest deadline, ties round robin,
with its KV moves made: swaps out for room, swaps back in, rejections).
plan() admits that turn's request to prefill when it is new to the slice;
paused() holds back every running request but the turn's ready decodes and
its one prefilling request (its chunk is the request's own chunk_tokens);
timed() times the pass by the wiring's cost model (weights partly resident,
the rest streamed over the link the slices share) in place of the core's
compute and link terms; emitted() moves a finished prefill into the
model's running requests. The core's block pool counts KV tokens (one-token
blocks) and never limits: the slice's KV room (its HBM less the resident
weights) is the wiring's, which decides the swaps."""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np

from planner.replay.batch import Batch
from planner.replay.engine_state import FINISHED, QUEUED, EngineState
from planner.replay.kv_residency import ResidentIteration
from planner.replay.schedulers import EngineView, SchedulePlan
from planner.replay.serverless_slices import NOBODY, Resident, Slice, SlicedRequest
from planner.replay.state import IntArray

_NOTHING = SchedulePlan()


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

    def next_turn(self, s: Slice, now_s: float) -> Turn:
        """The turn to run now, its KV moves made on the slice's core."""
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

    def __init__(self, turns: SliceTurns) -> None:
        self._turns = turns
        self._slice: Slice | None = None
        self.turn = NO_TURN
        self._pass = Pass(0, 0, 0)
        self._now_s = 0.0

    def bind(self, s: Slice) -> None:
        self._slice = s

    @property
    def slice(self) -> Slice:
        assert self._slice is not None, "model residency used before its slice was bound"
        return self._slice

    # -- the core's scheduler -----------------------------------------------

    def plan(self, view: EngineView) -> SchedulePlan:
        turn = self._turns.next_turn(self.slice, view.now_s)
        self.turn = turn
        head = turn.head
        if head is not None and view.requests.phase.item(head.row) == QUEUED:
            return SchedulePlan(start=np.array([head.row], dtype=np.int64))
        return _NOTHING

    # -- the core's KV residency ----------------------------------------------

    def paused(self, state: EngineState, now_s: float) -> IntArray:
        turn = self.turn
        head = turn.head
        running = state.running.rows
        self._now_s = now_s
        if turn.resident is NOBODY:
            return running
        self._pass = Pass(
            min(head.chunk, head.prompt_tokens - head.prefilled) if head is not None else 0,
            sum(q.prompt_tokens + q.generated for q in turn.decodes),
            head.prefilled if head is not None else 0,
        )
        runs = [q.row for q in turn.decodes]
        if head is not None:
            runs.append(head.row)
        held: IntArray = running[~np.isin(running, runs)]
        return held

    def timed(self, batch: Batch, compute_s: float) -> ResidentIteration:
        seconds = self._turns.pass_s(self.slice, self.turn, self._pass, self._now_s)
        return ResidentIteration(seconds, 0.0, 0, 0)

    def emitted(self, state: EngineState, batch: Batch, now_s: float) -> None:
        r, head, _ = self.turn
        phase = state.requests.phase
        r.last_used_s = now_s
        r.running = [q for q in r.running if phase.item(q.row) != FINISHED]
        if head is not None and head.prefill_done:
            r.queue.popleft()
            if phase.item(head.row) != FINISHED:
                r.running.append(head)
