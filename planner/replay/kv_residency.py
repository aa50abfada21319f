"""Per-layer KV residency, a strategy of the batching core
(planner.replay.batching_core): which running requests decode in an
iteration and which layers of their KV stay on the GPU; the KV of the others
is fetched over the link while the layers compute, and the iteration is
timed by that overlap in place of the core's link term. The core asks the
strategy before forming a decode batch (whom to pause), times each batch
through it, and tells it what the batch emitted.

planner.replay.layer_residency implements it for the long-context
topology's LongctxPolicy objects."""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

from planner.replay.batch import Batch
from planner.replay.engine_state import EngineState
from planner.replay.state import IntArray


class ResidentIteration(NamedTuple):
    """An iteration as the residency times it: its seconds (fetch stalls
    included), the stall, the GPU blocks it holds and the bytes it fetched."""

    iteration_s: float
    stall_s: float
    gpu_blocks_used: int
    h2d_bytes: int


class KvResidency(Protocol):
    def paused(self, state: EngineState, now_s: float) -> IntArray:
        """Before a decode batch: the running rows that do not decode in it
        (the residency plan for the others is kept for timed)."""
        ...

    def timed(self, batch: Batch, compute_s: float) -> ResidentIteration:
        """The batch's iteration, compute_s being the cost model's seconds."""
        ...

    def emitted(self, state: EngineState, batch: Batch, now_s: float) -> None:
        """After the batch's tokens were emitted at now_s (finished rows
        have left running)."""
        ...


@runtime_checkable
class PicksRows(Protocol):
    """A KV residency that names the running rows that run (rather than
    those paused): the core forms the batch on those rows alone
    (batch.form_batch_of) without taking the others out of running and
    putting them back, where no decode can preempt; elsewhere it pauses the
    rest. runs() stands for paused() before the batch."""

    def runs(self, state: EngineState, now_s: float) -> list[int]:
        """Before a batch: the running rows that run in it, each once (the
        residency plan for them is kept for timed)."""
        ...
