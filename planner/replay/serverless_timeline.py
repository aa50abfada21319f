"""The serverless replay's timeline (what ``--report-dir`` plots): the
machine and each MIG slice sampled at fixed simulated times.

A sample is an event of the run's loop that runs after every other event
of its instant and reads the slices (it changes nothing). Samples are
``interval`` simulated seconds apart from the first arrival, for as long as
other events are pending. The interval starts at the arrivals' span over
``MAX_SAMPLES``; whenever twice that many are held, every other one is
dropped and the interval doubles. So a run of any length keeps fewer
than twice ``MAX_SAMPLES`` evenly spaced samples (at least ``MAX_SAMPLES``
once it outlasts its arrivals' span; the plots draw at most
``planner.replay.plots.MAX_POINTS`` bins of them), sampling costs nothing
per iteration, and a run that plots nothing takes no samples.

A sample is the state at its instant: KV that rises and falls between two
samples is not seen. The C2C link's load is the bytes it moved (streamed
weights, KV moved in, weights loaded over it) since the previous sample
kept, over the time between them: the link utilization of the report's
table, per interval. A pass's streamed bytes and a weight copy's bytes
count as they flow (the pass's rate, the copy's share of the load link);
KV moved in counts when its move starts. The link's load may exceed its
sustained bandwidth: a pass keeps the share it started with while other
slices start streaming, and weight copies are not shared with streams.

What a sample holds, per slice (``UnitSample``): KV tokens in use
(requests whose KV is on the slice) against the slice's KV room (its HBM
less the resident weights, ``Slice.kv_capacity``), the resident weight
bytes (those being copied in included), requests running (prefill done)
and queued on it (to prefill, or their KV in host memory); for the
machine: the sums, the wait queue (requests waiting for a slice), and the
requests whose KV is in host memory (``rotary``) with their KV tokens
(``cpu_kv_blocks_used``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from planner.profiles.mig import GB
from planner.replay.events import Event, EventLoop
from planner.replay.records import TimelineSample, UnitSample
from planner.replay.serverless_events import ServerlessWiring
from planner.replay.serverless_slices import Slice, SlicedRequest

MAX_SAMPLES = 2000
# The first interval when every request arrives at once.
MIN_INTERVAL_S = 1e-3


def observe(
    now_s: float, slices: Sequence[Slice], wait_queue: Sequence[SlicedRequest]
) -> TimelineSample:
    """The machine and each slice at ``now_s`` (link load not yet known)."""
    units: list[UnitSample] = []
    in_host = 0
    host_kv = 0
    for q in wait_queue:
        if q.kv_in_host:
            in_host += 1
            host_kv += q.kv_tokens
    for s in slices:
        running = waiting = kv = 0
        for r in s.residents:
            running += len(r.running)
            waiting += len(r.queue)
            for part in (r.queue, r.running):
                for q in part:
                    if q.kv_in_host:
                        in_host += 1
                        host_kv += q.kv_tokens
                    else:
                        kv += q.kv_tokens
        units.append(UnitSample(s.id, kv, s.kv_capacity, s.resident_bytes, running, waiting))
    return TimelineSample(
        time_s=now_s,
        iteration_s=0.0,
        stall_s=0.0,
        gpu_kv_blocks_used=sum(u.kv_used for u in units),
        cpu_kv_blocks_used=host_kv,
        running=sum(u.running for u in units),
        waiting=len(wait_queue),
        rotary=in_host,
        prefill_tokens=0,
        decode_tokens=0,
        gpu_kv_blocks_capacity=sum(u.kv_capacity for u in units),
        units=tuple(units),
    )


class SliceTimeline:
    """The samples of one run (see the module doc)."""

    def __init__(
        self,
        loop: EventLoop[ServerlessWiring],
        slices: Sequence[Slice],
        wait_queue: Callable[[], Sequence[SlicedRequest]],
        link_bytes: Callable[[], float],
        loads_left: Callable[[float], float],
    ) -> None:
        """link_bytes: the C2C bytes counted so far (a transfer's when it
        starts); loads_left(now): those of the weight copies in flight that
        are still to move."""
        self._loop = loop
        self._slices = slices
        self._wait_queue = wait_queue
        self._link_bytes = link_bytes
        self._loads_left = loads_left
        self._interval_s = MIN_INTERVAL_S
        self._held: list[TimelineSample] = []
        # The link's bytes moved by each sample held.
        self._moved: list[float] = []

    @property
    def interval_s(self) -> float:
        return self._interval_s

    def start(self, first_arrival_s: float, last_arrival_s: float) -> None:
        self._interval_s = max((last_arrival_s - first_arrival_s) / MAX_SAMPLES, MIN_INTERVAL_S)
        self._loop.push(TimelineSampled(first_arrival_s, self))

    def take(self, now_s: float) -> None:
        self._held.append(observe(now_s, self._slices, self._wait_queue()))
        ahead = self._streaming_ahead(now_s) + self._loads_left(now_s)
        self._moved.append(self._link_bytes() - ahead)
        next_s = now_s + self._interval_s
        if len(self._held) >= 2 * MAX_SAMPLES:
            # This sample (an odd one) goes; the next is on the doubled grid.
            self._held = self._held[::2]
            self._moved = self._moved[::2]
            self._interval_s *= 2
        if len(self._loop):
            self._loop.push(TimelineSampled(next_s, self))

    def _streaming_ahead(self, now_s: float) -> float:
        """Bytes of the passes in progress that stream after ``now_s`` (a
        pass's bytes are counted when it starts; they flow at its rate)."""
        return sum(
            s.rate_gbps * GB * (s.iter_end_s - now_s)
            for s in self._slices
            if s.busy and s.iter_end_s > now_s
        )

    def samples(self) -> list[TimelineSample]:
        """The samples held, each with the link's load since the previous."""
        out: list[TimelineSample] = []
        previous: tuple[float, float] | None = None
        for sample, moved in zip(self._held, self._moved, strict=True):
            gbps = 0.0
            if previous is not None and sample.time_s > previous[0]:
                gbps = (moved - previous[1]) / (sample.time_s - previous[0]) / GB
            out.append(dataclasses.replace(sample, link_gbps=gbps))
            previous = (sample.time_s, moved)
        return out


@dataclass(frozen=True, slots=True)
class TimelineSampled(Event[ServerlessWiring]):
    """The timeline takes a sample (after every other event of the instant)."""

    timeline: SliceTimeline
    priority = 100

    def handle(self, target: ServerlessWiring) -> None:
        self.timeline.take(self.time_s)
