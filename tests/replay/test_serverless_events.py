"""The serverless topology's events: at one instant they run in the order
the engine needs (an arrival before the iteration that may take it, loads
before the drain limits, disk reads and share bounds), each calling its wiring method."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.replay.events import EventLoop
from planner.replay.serverless_events import (
    DrainLimit,
    LoadsDone,
    LoadStarts,
    ReadsDone,
    RequestArrives,
    ServerlessWiring,
    ShareBoundEnds,
    SliceIterates,
)


@dataclass(slots=True)
class Wiring:
    calls: list[tuple[str, int, float]] = field(default_factory=list)

    def arrive(self, row: int, now_s: float) -> None:
        self.calls.append(("arrive", row, now_s))

    def iterate(self, slice_index: int, now_s: float) -> None:
        self.calls.append(("iterate", slice_index, now_s))

    def start_load(self, slice_index: int, now_s: float) -> None:
        self.calls.append(("start_load", slice_index, now_s))

    def finish_loads(self, version: int, now_s: float) -> None:
        self.calls.append(("finish_loads", version, now_s))

    def end_drain(self, slice_index: int, now_s: float) -> None:
        self.calls.append(("end_drain", slice_index, now_s))

    def finish_reads(self, version: int, now_s: float) -> None:
        self.calls.append(("finish_reads", version, now_s))

    def end_share_bound(self, now_s: float) -> None:
        self.calls.append(("end_share_bound", -1, now_s))


def test_same_instant_runs_arrivals_iterations_loads_drains_reads() -> None:
    loop: EventLoop[ServerlessWiring] = EventLoop()
    for event in (
        ShareBoundEnds(2.0),
        ReadsDone(2.0, 9),
        DrainLimit(2.0, 1),
        LoadsDone(2.0, 4),
        LoadStarts(2.0, 0),
        SliceIterates(2.0, 2),
        RequestArrives(2.0, 7),
        SliceIterates(1.0, 0),
    ):
        loop.push(event)
    wiring = Wiring()
    loop.run(wiring, lambda: False)
    assert wiring.calls == [
        ("iterate", 0, 1.0),
        ("arrive", 7, 2.0),
        ("iterate", 2, 2.0),
        ("start_load", 0, 2.0),
        ("finish_loads", 4, 2.0),
        ("end_drain", 1, 2.0),
        ("finish_reads", 9, 2.0),
        ("end_share_bound", -1, 2.0),
    ]
