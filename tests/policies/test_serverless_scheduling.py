"""Queue-aware scheduling of waiting models (planner.policies.serverless.
routing): the eviction order (inactive, lower priority, then equal-priority
models that held their slice for Q: with enough slack when the waiting
model is urgent, whatever their slack when it starves), the order of a
scheduling round, and the starvation bound, on hand-checked cases."""

from __future__ import annotations

import functools
import math

import pytest

from planner.domain.serverless import PreemptionParams, ServerlessModel, SliceState, WaitingModel
from planner.policies.serverless import (
    ACTIVE,
    EVICT,
    HELD,
    IDLE,
    INACTIVE,
    LOWER_PRIORITY,
    QUEUE,
    STARVING,
    eviction_order,
    next_turn,
    route_request,
    schedule_waiting,
    service_order,
    starvation_bound_s,
)
from planner.profiles.mig import MIG_PROFILES

GB = 10**9
P3 = MIG_PROFILES["gh200-3x24gb"]
BUDGET = 364.5
# Hold Q = 2 s; urgent at 1 s of slack; victims need 3 s; starving after 20 s.
PARAMS = PreemptionParams(
    min_hold_s=2.0, urgent_slack_s=1.0, victim_slack_s=3.0, starve_after_s=20.0
)


def model(name: str, gbps: float = 100.0) -> ServerlessModel:
    # Weight bytes chosen so that c2c_gbps == gbps at TPOT 0.1 s.
    return ServerlessModel(name, int(gbps * 0.1 * GB), 0.1)


def busy(
    id_: str,
    name: str,
    *,
    since: float = 0.0,
    slack: float = math.inf,
    prio: float = 1.0,
    in_flight: int = 2,
    last: float = 0.0,
    gbps: float = 100.0,
) -> SliceState:
    return SliceState(
        id_,
        P3,
        model=name,
        model_c2c_gbps=gbps,
        model_priority=prio,
        in_flight=in_flight,
        last_used_s=last,
        active_since_s=since,
        slack_s=slack,
    )


def ids(order: list[tuple[SliceState, str]]) -> list[tuple[str, str]]:
    return [(s.id, kind) for s, kind in order]


ORDER = functools.partial(
    eviction_order, priority=1.0, link_budget_gbps=1000.0, now_s=10.0, preemption=PARAMS
)


# --- eviction order ------------------------------------------------------------


def test_eviction_order_inactive_then_lower_priority_then_held() -> None:
    slices = [
        busy("h-old", "a", since=0.0, slack=3.0),
        busy("h-slack", "b", since=5.0, slack=9.0),
        busy("tight", "g", since=0.0, slack=2.9),  # less slack than V = 3 s
        busy("young", "c", since=9.5, slack=50.0),  # held 0.5 s < Q
        busy("low", "d", prio=0.5, since=9.9, slack=0.0),
        busy("idle-new", "e", in_flight=0, last=8.0),
        busy("idle-old", "f", in_flight=0, last=4.0),
    ]
    order = ORDER(model("x"), slices, waited_s=1.0, waiter_slack_s=0.5)
    # Inactive least recently used first; the lower-priority model even
    # though it just started and has no slack; then of the models that held
    # their slice for Q = 2 s and have V = 3 s of slack, the one with the
    # most slack (9 s before 3 s). "tight" lacks slack, "young" hold time.
    assert ids(order) == [
        ("idle-old", INACTIVE),
        ("idle-new", INACTIVE),
        ("low", LOWER_PRIORITY),
        ("h-slack", HELD),
        ("h-old", HELD),
    ]
    # Starving (waited W_s = 20 s): the tight one too, after those with
    # slack; the young one still not.
    order = ORDER(model("x"), slices, waited_s=20.0, waiter_slack_s=50.0)
    assert ids(order)[3:] == [("h-slack", STARVING), ("h-old", STARVING), ("tight", STARVING)]


def test_held_models_are_candidates_only_when_the_waiter_is_urgent_or_starving() -> None:
    slices = [busy("a", "a", since=0.0, slack=5.0), busy("b", "b", since=0.0, slack=4.0)]
    assert ORDER(model("x"), slices, waited_s=19.9, waiter_slack_s=1.01) == []
    assert ids(ORDER(model("x"), slices, waited_s=0.0, waiter_slack_s=1.0)) == [
        ("a", HELD),
        ("b", HELD),
    ]
    # A waiter that already missed its deadline is urgent too.
    assert len(ORDER(model("x"), slices, waited_s=0.0, waiter_slack_s=-7.0)) == 2
    # Equal slack: the one that has held its slice longest goes first.
    slices = [busy("a", "a", since=3.0), busy("b", "b", since=1.0)]
    assert [s.id for s, _ in ORDER(model("x"), slices, waiter_slack_s=0.0)] == ["b", "a"]
    # No preemption parameters, or preemption off: no held candidates.
    assert eviction_order(model("x"), slices, priority=1.0, link_budget_gbps=1000.0) == []
    assert ORDER(model("x"), slices, waited_s=50.0, waiter_slack_s=0.0, allow_preempt=False) == []


def test_higher_priority_models_are_never_preempted() -> None:
    slices = [busy("a", "a", prio=2.0, since=0.0), busy("b", "b", prio=1.0, since=0.0)]
    order = ORDER(model("x"), slices, waited_s=100.0, waiter_slack_s=-100.0)
    assert ids(order) == [("b", HELD)]


def test_a_victim_must_leave_room_on_the_link() -> None:
    # 364.5 GB/s budget: a (100) + b (200) active; x needs 150. Trading a
    # leaves 200 + 150 = 350 (fits); trading b leaves 100 + 150 (fits too);
    # a 250 GB/s model fits only in place of b (100 + 250 = 350).
    slices = [busy("a", "a", gbps=100.0), busy("b", "b", gbps=200.0)]
    order = functools.partial(ORDER, link_budget_gbps=BUDGET, waiter_slack_s=0.0)
    assert {s.id for s, _ in order(model("x", 150.0), slices)} == {"a", "b"}
    assert [s.id for s, _ in order(model("x", 250.0), slices)] == ["b"]


def test_route_preempts_a_held_model_and_says_why() -> None:
    slices = [busy("a", "a", since=0.0, slack=4.0), busy("b", "b", since=0.0, slack=7.5)]
    route = functools.partial(
        route_request, priority=1.0, link_budget_gbps=BUDGET, now_s=10.0, preemption=PARAMS
    )
    d = route(model("x"), slices, slack_s=0.8)
    assert (d.action, d.slice_id, d.evicted_model, d.preempts) == (EVICT, "b", "b", True)
    assert "urgent" in d.reason and "slack 7.5" in d.reason
    assert d.link_demand_gbps == pytest.approx(200.0)
    q = route(model("x"), slices, slack_s=4.0, waited_s=1.0)
    assert q.action == QUEUE and "not yet allowed to preempt" in q.reason
    # Starving: drain the victim (no new requests, the place is handed over
    # when its requests in flight are done) instead of preempting it.
    s = route(model("x"), slices, slack_s=4.0, waited_s=20.0)
    assert (s.action, s.slice_id) == (EVICT, "b") and "starving" in s.reason
    assert (s.drains, s.preempts, s.eviction) == (True, False, STARVING)
    # Evicting an inactive model preempts nothing.
    d = route_request(
        model("x"), [busy("a", "a", in_flight=0)], priority=1.0, link_budget_gbps=BUDGET
    )
    assert (d.action, d.preempts) == (EVICT, False)


# --- a scheduling round ----------------------------------------------------------


def waiting(
    name: str, since: float, prio: float = 1.0, n: int = 1, slack: float = 0.0
) -> WaitingModel:
    return WaitingModel(model(name), prio, since, n, slack)


def test_service_order_priority_then_starving_oldest_then_least_slack() -> None:
    ws = [
        waiting("calm", 9.0, slack=4.0),
        waiting("urgent", 9.5, slack=0.2),
        waiting("starved-late", -5.0, slack=9.0),  # waited 15 s < 20
        waiting("starved-b", -20.0, slack=9.0),
        waiting("starved-a", -30.0, slack=30.0),
        waiting("vip", 9.9, prio=2.0, slack=5.0),
    ]
    order = [w.model.name for w in service_order(ws, now_s=10.0, preemption=PARAMS)]
    assert order == ["vip", "starved-a", "starved-b", "urgent", "calm", "starved-late"]
    # Without preemption parameters: oldest first.
    order = [w.model.name for w in service_order(ws, now_s=10.0, preemption=None)]
    assert order == ["vip", "starved-a", "starved-b", "starved-late", "calm", "urgent"]


def test_round_never_takes_a_slice_twice() -> None:
    slices = [
        busy("s0", "a", since=0.0, slack=4.0),
        busy("s1", "b", since=0.0, slack=5.0),
        busy("s2", "c", since=9.0, slack=50.0),  # held 1 s < Q
    ]
    round_ = schedule_waiting(
        [waiting("late", 8.5, slack=0.5), waiting("old", 3.0, slack=0.9), waiting("vip", 9.9, 2.0)],
        slices,
        now_s=10.0,
        link_budget_gbps=BUDGET,
        preemption=PARAMS,
    )
    got = [(r.model, r.decision.action, r.decision.slice_id) for r in round_]
    # vip first (higher priority: every priority-1 model is below it, held
    # or not, so it takes the lowest-priority slice with the fewest in
    # flight, ties on last use then id: s0); then late (least slack) takes
    # the remaining held slice with slack s1; old finds s2 too young.
    assert got == [("vip", EVICT, "s0"), ("late", EVICT, "s1"), ("old", QUEUE, "")]


def test_round_routes_to_active_and_idle_slices_first() -> None:
    slices = [busy("s0", "a", since=0.0, slack=10.0), SliceState("s1", P3)]
    round_ = schedule_waiting(
        [waiting("a", 5.0, n=3), waiting("x", 6.0), waiting("y", 7.0)],
        slices,
        now_s=10.0,
        link_budget_gbps=BUDGET,
        preemption=PARAMS,
    )
    got = [(r.model, r.decision.action, r.decision.slice_id) for r in round_]
    # Equal slack, so oldest first: a joins its active slice (which then has
    # 2 + 3 in flight); x takes the idle slice; y may preempt only s0 (s1 was
    # just handed to x), which has held it for 10 s with 10 s of slack.
    assert got == [("a", ACTIVE, "s0"), ("x", IDLE, "s1"), ("y", EVICT, "s0")]
    assert "5 in flight" in round_[2].decision.reason


def test_round_rejects_a_model_listed_twice() -> None:
    with pytest.raises(ValueError, match="twice"):
        schedule_waiting(
            [waiting("a", 1.0), waiting("a", 2.0)],
            [SliceState("s", P3)],
            now_s=3.0,
            link_budget_gbps=BUDGET,
        )


def test_preemption_params_are_checked() -> None:
    with pytest.raises(ValueError, match="min_hold_s"):
        PreemptionParams(min_hold_s=-1.0, urgent_slack_s=0.0, victim_slack_s=0.0, starve_after_s=1)
    with pytest.raises(ValueError, match="starve_after_s"):
        PreemptionParams(
            min_hold_s=1.0, urgent_slack_s=0.0, victim_slack_s=0.0, starve_after_s=math.nan
        )
    # inf turns the backstop off: no bound then.
    off = PreemptionParams(
        min_hold_s=1.0, urgent_slack_s=0.0, victim_slack_s=math.inf, starve_after_s=math.inf
    )
    with pytest.raises(ValueError, match="no bound"):
        starvation_bound_s(ahead=0, usable_slices=1, preemption=off, iteration_s=0, switch_s=0)
    with pytest.raises(ValueError, match="urgent_slack_s"):
        PreemptionParams(
            min_hold_s=1.0, urgent_slack_s=math.nan, victim_slack_s=0.0, starve_after_s=1
        )


# --- the starvation bound ---------------------------------------------------------


def test_starvation_bound_hand_checked() -> None:
    # One cycle = Q + switch + 2 iterations = 2 + 0.05 + 0.2 = 2.25 s; W_s 20 s.
    bound = functools.partial(
        starvation_bound_s, usable_slices=3, preemption=PARAMS, iteration_s=0.1, switch_s=0.05
    )
    assert bound(ahead=0) == pytest.approx(20 + 2.25)
    assert bound(ahead=2) == pytest.approx(20 + 2.25)
    assert bound(ahead=3) == pytest.approx(20 + 2 * 2.25)
    assert bound(ahead=7) == pytest.approx(20 + 3 * 2.25)
    # A drain of up to 30 s lengthens every cycle.
    assert bound(ahead=3, drain_s=30.0) == pytest.approx(20 + 2 * 32.25)
    with pytest.raises(ValueError):
        bound(ahead=-1)
    with pytest.raises(ValueError):
        bound(ahead=0, usable_slices=0)


def test_schedule_waiting_through_time_stays_within_the_bound() -> None:
    """Drive schedule_waiting through time on one slice shared by three
    always-busy models whose requests never have slack (so only the
    starvation backstop takes the slice): iterations of 0.1 s whose requests
    finish with the iteration (a drain of one iteration), switches of
    0.05 s, Q = 1 s, W_s = 0.5 s. Each model, once drained, waits again from
    when its last iteration ended; every wait is within the bound with the
    two others ahead."""
    params = PreemptionParams(
        min_hold_s=1.0, urgent_slack_s=-1e9, victim_slack_s=1e9, starve_after_s=0.5
    )
    iteration, switch = 0.1, 0.05
    bound = functools.partial(
        starvation_bound_s,
        usable_slices=1,
        preemption=params,
        iteration_s=iteration,
        switch_s=switch,
        drain_s=iteration,
    )
    since = {"b": 0.0, "c": 0.0}  # waiting models and since when
    state = busy("s", "a", since=0.0, in_flight=1, slack=0.0)
    waits: list[float] = []
    now = 0.0
    while now < 60.0:
        round_ = schedule_waiting(
            [waiting(n, t, slack=0.0) for n, t in since.items()],
            [state],
            now_s=now,
            link_budget_gbps=BUDGET,
            preemption=params,
        )
        taken = [r for r in round_ if r.decision.action == EVICT]
        end = now + iteration  # the slice finishes its iteration
        if taken:
            assert taken[0].decision.drains and "starving" in taken[0].decision.reason
            winner = taken[0].model
            waits.append(now - since.pop(winner))
            since[state.model] = end
            ready = end + switch
            state = busy("s", winner, since=ready, in_flight=1, slack=0.0)
            now = ready
        else:
            now = end
    assert len(waits) > 20
    assert max(waits) <= bound(ahead=2)
    # A model drained off the slice waits behind one other at most (the
    # third holds the slice): the bound with one ahead holds too, and is
    # within a cycle's slack of what happens (0.5 + 2 x 1.35 s = 3.2 s vs 2.4 s).
    assert bound(ahead=1) == pytest.approx(3.2)
    assert 2.3 < max(waits) <= bound(ahead=1)


# --- turns among a slice's models ---------------------------------------------------


def test_next_turn_earliest_deadline_then_round_robin() -> None:
    # Resident 1 has nothing to run; 2 has the earliest deadline.
    assert next_turn([5.0, None, 3.0, 4.0], after=0) == 2
    # Ties go round robin from the one after the last to run.
    assert next_turn([1.0, 1.0, 1.0], after=0) == 1
    assert next_turn([1.0, 1.0, 1.0], after=1) == 2
    assert next_turn([1.0, 1.0, 1.0], after=2) == 0
    assert next_turn([None, None], after=0) is None
    assert next_turn([], after=0) is None


@pytest.mark.parametrize(
    ("in_flight", "requests", "action"),
    [(1, 1, "share"), (1, 2, QUEUE), (2, 1, QUEUE), (3, 1, QUEUE)],
)
def test_a_model_shares_only_a_light_slice(in_flight: int, requests: int, action: str) -> None:
    # One busy slice of room for two; the waiting model may join it only
    # while its resident's requests and its own are at most
    # share_max_in_flight = 2 (so that joining never makes the slice shed).
    slices = [busy("s0", "a", in_flight=in_flight, since=0.0)]
    d = route_request(
        model("b"),
        slices,
        priority=1.0,
        link_budget_gbps=BUDGET,
        now_s=1.0,
        max_models_per_slice=2,
        share_max_in_flight=2,
        requests=requests,
    )
    assert d.action == action
    unlimited = route_request(
        model("b"), slices, priority=1.0, link_budget_gbps=BUDGET, max_models_per_slice=2
    )
    assert unlimited.action == "share"
