"""Properties of the serverless policy on random instances: every placement
it calls feasible satisfies every constraint and is at least as good as the
greedy; routing never takes the active set over the link budget; a
scheduling round keeps the link budget and the models-per-slice limit,
hands each place out once and never evicts a higher priority."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.domain.serverless import (
    MigSlice,
    PlacementParams,
    PreemptionParams,
    ServerlessModel,
    SliceState,
    WaitingModel,
)
from planner.policies.serverless import (
    ACTIVE,
    EVICT,
    IDLE,
    QUEUE,
    STARVING,
    UNPLACED,
    greedy_assignment,
    lexicographic_key,
    plan_placement,
    route_request,
    schedule_waiting,
    service_order,
    violation,
)
from planner.profiles.mig import MIG_PROFILES

GB = 10**9
PROFILES = list(MIG_PROFILES.values())

models_st = st.lists(
    st.builds(
        lambda i, w, t, h, b, wt, req: ServerlessModel(
            f"m{i}", int(w * GB), t, int(h * GB), b, 0, wt, req
        ),
        st.integers(0, 10**6),
        st.sampled_from([1, 3, 8, 16, 28, 60, 140]),
        st.sampled_from([0.05, 0.1, 0.2, 0.5, 1.0]),
        st.floats(0, 40),
        st.floats(0, 2500),
        st.floats(0.1, 10),
        st.booleans(),
    ),
    min_size=1,
    max_size=8,
    unique_by=lambda m: m.name,
)
slices_st = st.lists(st.sampled_from(PROFILES), min_size=1, max_size=4).map(
    lambda ps: [MigSlice(f"s{i}", p) for i, p in enumerate(ps)]
)


@settings(max_examples=60, deadline=None)
@given(models=models_st, slices=slices_st, k=st.integers(1, 3), link=st.floats(50, 900))
def test_feasible_plans_satisfy_every_constraint(models, slices, k, link):
    params = PlacementParams(link_gbps=link, max_models_per_slice=k, time_limit_s=5.0)
    plan = plan_placement(models, slices, params)
    where = {a.model: a.slice_id for a in plan.assignments}
    index = {s.id: i for i, s in enumerate(slices)}
    chosen = [index[where[m.name]] if m.name in where else UNPLACED for m in models]
    assert plan.feasible == (violation(models, slices, chosen, params) == "")
    if plan.feasible:
        assert plan.link_demand_gbps <= params.link_budget_gbps * (1 + 1e-9)
        greedy = greedy_assignment(models, slices, params)
        if not violation(models, slices, greedy, params):
            assert lexicographic_key(models, slices, chosen, params) >= lexicographic_key(
                models, slices, greedy, params
            )
    assert len(plan.assignments) + len(plan.unplaced) == len(models)


slice_state_st = st.builds(
    lambda i, p, busy, gbps, prio, n, last: SliceState(
        f"s{i}", p, f"r{i}" if busy else "", gbps if busy else 0.0, prio, n if busy else 0, last
    ),
    st.integers(0, 10**6),
    st.sampled_from(PROFILES),
    st.booleans(),
    st.floats(0, 150),
    st.floats(0, 5),
    st.integers(0, 4),
    st.floats(0, 100),
)


@settings(max_examples=200, deadline=None)
@given(
    states=st.lists(slice_state_st, min_size=1, max_size=7, unique_by=lambda s: s.id),
    gbps=st.floats(1, 400),
    hbm=st.floats(0, 60),
    priority=st.floats(0, 5),
)
def test_routing_keeps_the_active_set_within_the_link_budget(states, gbps, hbm, priority):
    budget = 364.5
    if sum(s.model_c2c_gbps for s in states) > budget:
        return  # the property is about not making things worse
    model = ServerlessModel("new", int(gbps * 0.1 * GB), 0.1, int(hbm * GB))
    d = route_request(model, states, priority=priority, link_budget_gbps=budget)
    assert d.action in {ACTIVE, IDLE, EVICT, QUEUE}
    if d.action in {IDLE, EVICT}:
        assert d.link_demand_gbps <= budget * (1 + 1e-9)
        target = next(s for s in states if s.id == d.slice_id)
        assert model.hbm_bytes <= target.profile.hbm_bytes
        if d.action == IDLE:
            assert not target.model
        else:
            assert d.evicted_model == target.model
            assert target.in_flight == 0 or target.model_priority < priority
    if d.action == QUEUE:
        assert d.slice_id == ""


resident_st = st.builds(
    lambda sid, name, gbps, prio, n, since, slack: SliceState(
        f"s{sid}",
        MIG_PROFILES["gh200-3x24gb"],
        model=f"r{name}",
        model_c2c_gbps=gbps,
        model_priority=prio,
        in_flight=n,
        last_used_s=since,
        active_since_s=since,
        slack_s=slack,
    ),
    st.integers(0, 3),
    st.integers(0, 30),
    st.floats(10, 120),
    st.sampled_from([0.0, 1.0, 2.0]),
    st.integers(0, 4),
    st.floats(0, 100),
    st.floats(-10, 200),
)
waiting_st = st.lists(
    st.builds(
        lambda i, gbps, prio, since, n, slack: WaitingModel(
            ServerlessModel(f"w{i}", int(gbps * 0.1 * GB), 0.1), prio, since, n, slack
        ),
        st.integers(0, 20),
        st.floats(10, 120),
        st.sampled_from([0.0, 1.0, 2.0]),
        st.floats(0, 100),
        st.integers(1, 5),
        st.floats(-10, 200),
    ),
    max_size=6,
    unique_by=lambda w: w.model.name,
)


@settings(max_examples=150, deadline=None)
@given(
    residents=st.lists(resident_st, max_size=8, unique_by=lambda s: (s.id, s.model)),
    waiting=waiting_st,
    per_slice=st.integers(1, 3),
    starve=st.floats(0, 200),
)
def test_a_scheduling_round_respects_link_slots_and_priorities(
    residents, waiting, per_slice, starve
):
    """Whatever the round decides: the link budget and K models per slice
    hold after every decision (if they held before), a place is taken at most
    once, and no model of higher priority is evicted."""
    budget = 364.5
    by_id: dict[str, list[SliceState]] = {}
    for s in residents:
        by_id.setdefault(s.id, []).append(s)
    states = [s for entries in by_id.values() for s in entries[:per_slice]]
    states += [
        SliceState(f"s{i}", MIG_PROFILES["gh200-3x24gb"]) for i in range(4) if f"s{i}" not in by_id
    ]
    names = {s.model for s in states}
    waiting = [w for w in waiting if w.model.name not in names]
    if sum(s.model_c2c_gbps for s in states) > budget:
        return
    params = PreemptionParams(
        min_hold_s=5.0, urgent_slack_s=10.0, victim_slack_s=50.0, starve_after_s=starve
    )
    routes = schedule_waiting(
        waiting,
        states,
        now_s=100.0,
        link_budget_gbps=budget,
        preemption=params,
        max_models_per_slice=per_slice,
    )
    assert [r.model for r in routes] == [
        w.model.name for w in service_order(waiting, now_s=100.0, preemption=params)
    ]
    by_name = {w.model.name: w for w in waiting}
    current = {(s.id, s.model): s for s in states if s.model}
    idle = {s.id for s in states if not s.model}
    taken: set[tuple[str, str]] = set()
    for r in routes:
        d, w = r.decision, by_name[r.model]
        if d.action in {QUEUE, ACTIVE}:
            continue
        if d.action == EVICT:
            key = (d.slice_id, d.evicted_model)
            assert key in current and key not in taken
            victim = current.pop(key)
            assert victim.in_flight == 0 or victim.model_priority <= w.priority
            assert d.drains == (d.eviction == STARVING and victim.in_flight > 0)
        elif d.action == IDLE:
            assert d.slice_id in idle
            idle.discard(d.slice_id)
        current[(d.slice_id, r.model)] = SliceState(
            d.slice_id, MIG_PROFILES["gh200-3x24gb"], model=r.model, model_c2c_gbps=w.model.c2c_gbps
        )
        taken.add((d.slice_id, r.model))
        assert sum(s.model_c2c_gbps for s in current.values()) <= budget * (1 + 1e-9)
        on_slice = [k for k in current if k[0] == d.slice_id]
        assert len(on_slice) <= per_slice
