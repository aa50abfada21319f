"""The event loop: events run by time, then priority, then the order they
were pushed; a handler may schedule more; run stops when told."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from planner.replay.events import Event, EventLoop


@dataclass(slots=True)
class Log:
    loop: EventLoop[Log]
    seen: list[tuple[float, str, int]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Early(Event[Log]):
    tag: int
    priority = 0

    def handle(self, target: Log) -> None:
        target.seen.append((self.time_s, "early", self.tag))


@dataclass(frozen=True, slots=True)
class Late(Event[Log]):
    tag: int
    priority = 1

    def handle(self, target: Log) -> None:
        target.seen.append((self.time_s, "late", self.tag))


@dataclass(frozen=True, slots=True)
class Echo(Event[Log]):
    """Schedules an Early event `delay_s` later."""

    delay_s: float
    priority = 1

    def handle(self, target: Log) -> None:
        target.seen.append((self.time_s, "echo", 0))
        target.loop.push(Early(self.time_s + self.delay_s, 99))


def test_same_time_lower_priority_first_then_push_order() -> None:
    loop: EventLoop[Log] = EventLoop()
    log = Log(loop)
    loop.push(Late(1.0, 0))
    loop.push(Early(1.0, 1))
    loop.push(Early(0.5, 2))
    loop.push(Early(1.0, 3))
    loop.run(log, lambda: False)
    assert log.seen == [(0.5, "early", 2), (1.0, "early", 1), (1.0, "early", 3), (1.0, "late", 0)]
    assert loop.now_s == 1.0
    assert len(loop) == 0


def test_handlers_schedule_and_done_stops_the_loop() -> None:
    loop: EventLoop[Log] = EventLoop()
    log = Log(loop)
    loop.push(Echo(1.0, 0.0))  # its Early comes at the same instant, after it
    loop.push(Late(1.0, 7))
    loop.push(Late(5.0, 8))
    loop.run(log, lambda: len(log.seen) == 3)
    assert log.seen == [(1.0, "echo", 0), (1.0, "early", 99), (1.0, "late", 7)]
    assert len(loop) == 1  # the 5 s event is left


@given(
    st.lists(
        st.tuples(st.integers(0, 5).map(float), st.booleans()),
        max_size=40,
    )
)
def test_pop_order_is_time_priority_push_order(events: list[tuple[float, bool]]) -> None:
    loop: EventLoop[Log] = EventLoop()
    log = Log(loop)
    for i, (t, late) in enumerate(events):
        loop.push(Late(t, i) if late else Early(t, i))
    loop.run(log, lambda: False)
    want = sorted(
        ((t, "late" if late else "early", i) for i, (t, late) in enumerate(events)),
        key=lambda e: (e[0], e[1] == "late", e[2]),
    )
    assert log.seen == want


@given(
    st.lists(st.tuples(st.integers(0, 5).map(float), st.booleans()), max_size=20),
    st.integers(0, 5).map(float),
    st.booleans(),
)
def test_in_place_before_s_is_when_a_new_event_would_pop_first(
    queued: list[tuple[float, bool]], time_s: float, late: bool
) -> None:
    # An event pushed for a time below in_place_before_s(its priority) is the
    # next to pop, and one pushed at or past it is not: a handler may do
    # that event's work in place exactly then.
    loop: EventLoop[Log] = EventLoop()
    for i, (t, queued_late) in enumerate(queued):
        loop.push(Late(t, i) if queued_late else Early(t, i))
    new = Late(time_s, -1) if late else Early(time_s, -1)
    in_place = time_s < loop.in_place_before_s(new.priority)
    loop.push(new)
    assert (loop.pop() is new) == in_place


def test_in_place_before_s_of_an_empty_loop_is_unbounded() -> None:
    assert EventLoop[Log]().in_place_before_s(0) == float("inf")
