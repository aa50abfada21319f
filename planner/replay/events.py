"""Typed events and the one event loop of the event-driven replay topologies.

An event is a frozen record with a time and a class-level priority; the
queue pops the earliest, then the lowest priority, then the first pushed
(so equal events run in the order they were scheduled, and a run is
deterministic). A topology defines its events as subclasses of ``Event``
whose ``handle`` acts on the topology (``Event[Topology]``), and
``EventLoop.run`` pops and handles them until the queue empties or the
topology says it is done.
"""

from __future__ import annotations

import heapq
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

Topology = TypeVar("Topology")


@dataclass(frozen=True, slots=True)
class Event(ABC, Generic[Topology]):
    """Something that happens to a topology at time_s. Among events at the
    same time, the lower priority runs first."""

    time_s: float
    priority: ClassVar[int]

    @abstractmethod
    def handle(self, target: Topology) -> None:
        """Acts on the topology (it may schedule further events)."""


class EventLoop(Generic[Topology]):
    """One heap of events, ordered by (time, priority, order pushed)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Event[Topology]]] = []
        self._pushed = 0
        self.now_s = 0.0

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, event: Event[Topology]) -> None:
        heapq.heappush(self._heap, (event.time_s, event.priority, self._pushed, event))
        self._pushed += 1

    def pop(self) -> Event[Topology]:
        """The next event; the clock moves to its time."""
        event = heapq.heappop(self._heap)[3]
        self.now_s = event.time_s
        return event

    def in_place_before_s(self, priority: int) -> float:
        """An event of this priority, were it pushed now for a time below
        the returned one, would be the next to pop: its handler may do that
        event's work in place, without the push and the pop (the earliest
        queued event's time, or just past it when that event has a higher
        priority and so runs after a tie; inf when the queue is empty)."""
        if not self._heap:
            return math.inf
        first = self._heap[0]
        return math.nextafter(first[0], math.inf) if first[1] > priority else first[0]

    def run(self, target: Topology, done: Callable[[], bool]) -> None:
        """Pops and handles events until none is left or done() holds
        (checked before each)."""
        heap = self._heap
        while heap and not done():
            event = heapq.heappop(heap)[3]
            self.now_s = event.time_s
            event.handle(target)
