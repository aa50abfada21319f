"""The cluster topology's events (planner.replay.events), in the order they
run at one instant: arrivals, then unit steps, monitor ticks, restores
ending, migrations ending."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from planner.replay.events import Event


class ClusterWiring(Protocol):
    """What the cluster's events act on (ClusterEngine)."""

    def dispatch(self, row: int, now_s: float) -> None: ...

    def step(self, uid: int, now_s: float) -> None: ...

    def tick(self, now_s: float) -> None: ...

    def finish_restore(self, uid: int, now_s: float) -> None: ...

    def finish_migration(self, migration: int, now_s: float) -> None: ...


@dataclass(frozen=True, slots=True)
class RequestArrives(Event[ClusterWiring]):
    row: int
    priority = 0

    def handle(self, target: ClusterWiring) -> None:
        target.dispatch(self.row, self.time_s)


@dataclass(frozen=True, slots=True)
class UnitSteps(Event[ClusterWiring]):
    """A unit (instance or buddy group) runs its next iteration (a round)."""

    uid: int
    priority = 1

    def handle(self, target: ClusterWiring) -> None:
        target.step(self.uid, self.time_s)


@dataclass(frozen=True, slots=True)
class MonitorTicks(Event[ClusterWiring]):
    priority = 2

    def handle(self, target: ClusterWiring) -> None:
        target.tick(self.time_s)


@dataclass(frozen=True, slots=True)
class RestoreEnds(Event[ClusterWiring]):
    """A buddy group's dropped layers are back: it splits into instances."""

    uid: int
    priority = 3

    def handle(self, target: ClusterWiring) -> None:
        target.finish_restore(self.uid, self.time_s)


@dataclass(frozen=True, slots=True)
class MigrationEnds(Event[ClusterWiring]):
    """A live KV migration's copy is done."""

    migration: int
    priority = 4

    def handle(self, target: ClusterWiring) -> None:
        target.finish_migration(self.migration, self.time_s)
