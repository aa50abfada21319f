"""The single-engine topology's events (planner.replay.events), in the order
they run at one instant: arrivals, then the engine's iterations, then the
drain limit.

At most one event of each kind is queued. ``ArrivalsDue`` is at the next
arrival of the trace; the engine takes in every arrival up to its own clock
(the start of its next iteration), so the arrivals that came while an
iteration ran join together before the next one. ``EngineIterates`` is at
the engine's clock while it has work and another event comes first; its
handler runs iterations in place (one after another, or a quiet stretch in
one step) while no other event would pop before the next one
(``EventLoop.in_place_before_s``), which gives what one event per
iteration gives. An engine with nothing to do, or stopped by arrivals that
came during its last iteration, queues none: the ArrivalsDue handler takes
the arrivals in and starts it again (its EngineIterates in place, the same
way, when that would be the next event). ``DrainLimit`` is at the last
arrival plus the drain limit: an iteration that would start after it does
not, and the run ends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from planner.replay.events import Event


class EngineWiring(Protocol):
    """What the single engine's events act on (Engine)."""

    def arrive(self, now_s: float) -> None: ...

    def iterate(self, now_s: float) -> None: ...

    def end(self, now_s: float) -> None: ...


@dataclass(frozen=True, slots=True)
class ArrivalsDue(Event[EngineWiring]):
    """The trace's next arrival: the arrivals up to the engine's clock join
    its queue (an idle engine's clock moves to this time first)."""

    priority = 0

    def handle(self, target: EngineWiring) -> None:
        target.arrive(self.time_s)


@dataclass(frozen=True, slots=True)
class EngineIterates(Event[EngineWiring]):
    """The engine's next iteration starts."""

    priority = 1

    def handle(self, target: EngineWiring) -> None:
        target.iterate(self.time_s)


@dataclass(frozen=True, slots=True)
class DrainLimit(Event[EngineWiring]):
    """The drain limit after the last arrival: the run ends with what is
    left unfinished."""

    priority = 2

    def handle(self, target: EngineWiring) -> None:
        target.end(self.time_s)
