"""The serverless topology's events (planner.replay.events), in the order
they run at one instant: arrivals, then slice iterations, weight loads
starting, loads done, drain limits, disk reads done, the wait bounds of
ended shares.

The weight loads share one link, a processor-sharing resource
(``serverless_link.SharedLink``) that a load books when it starts; a
``LoadsDone`` carries the link's version when it was scheduled and does
nothing once a later booking has moved the next finish (the same for the
disk's reads)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from planner.replay.events import Event


class ServerlessWiring(Protocol):
    """What the serverless events act on (ServerlessEngine)."""

    def arrive(self, row: int, now_s: float) -> None: ...

    def iterate(self, slice_index: int, now_s: float) -> None: ...

    def start_load(self, slice_index: int, now_s: float) -> None: ...

    def finish_loads(self, version: int, now_s: float) -> None: ...

    def end_drain(self, slice_index: int, now_s: float) -> None: ...

    def finish_reads(self, version: int, now_s: float) -> None: ...

    def end_share_bound(self, now_s: float) -> None: ...


@dataclass(frozen=True, slots=True)
class RequestArrives(Event[ServerlessWiring]):
    row: int
    priority = 0

    def handle(self, target: ServerlessWiring) -> None:
        target.arrive(self.row, self.time_s)


@dataclass(frozen=True, slots=True)
class SliceIterates(Event[ServerlessWiring]):
    """A slice's iteration in progress ends (or it may start one)."""

    slice_index: int
    priority = 1

    def handle(self, target: ServerlessWiring) -> None:
        target.iterate(self.slice_index, self.time_s)


@dataclass(frozen=True, slots=True)
class LoadStarts(Event[ServerlessWiring]):
    """A model set up on a slice books the load link for its weights."""

    slice_index: int
    priority = 2

    def handle(self, target: ServerlessWiring) -> None:
        target.start_load(self.slice_index, self.time_s)


@dataclass(frozen=True, slots=True)
class LoadsDone(Event[ServerlessWiring]):
    """The load link's next booking finishes (if ``version`` is current)."""

    version: int
    priority = 3

    def handle(self, target: ServerlessWiring) -> None:
        target.finish_loads(self.version, self.time_s)


@dataclass(frozen=True, slots=True)
class DrainLimit(Event[ServerlessWiring]):
    """A drain started D ago: what it still has in flight is preempted."""

    slice_index: int
    priority = 4

    def handle(self, target: ServerlessWiring) -> None:
        target.end_drain(self.slice_index, self.time_s)


@dataclass(frozen=True, slots=True)
class ReadsDone(Event[ServerlessWiring]):
    """The disk's next read finishes (if ``version`` is current)."""

    version: int
    priority = 5

    def handle(self, target: ServerlessWiring) -> None:
        target.finish_reads(self.version, self.time_s)


@dataclass(frozen=True, slots=True)
class ShareBoundEnds(Event[ServerlessWiring]):
    """A model queued back from a shared slice may share again."""

    priority = 6

    def handle(self, target: ServerlessWiring) -> None:
        target.end_share_bound(self.time_s)
