"""Per-request routing (C2CServe §6.1) and the queue-aware scheduling of the
models waiting for a slice.

``route_request``, for one request: to a slice where its model is active;
else onto an idle slice that fits within the link budget; else onto the
first slice of ``eviction_order``; else queue.

``eviction_order`` ranks the slices a model may take, best first:

1. an inactive model (nothing in flight), least recently used first;
2. an active model of lower priority than the request (its in-flight
   requests are requeued), lowest priority first;
3. with ``PreemptionParams``: an active model of equal priority that has
   been ready on its slice for at least Q (``min_hold_s``), once the
   request's model has waited W (``preempt_after_s``) and every request on
   that slice has at least ``victim_slack_s`` of slack (HELD), or, whatever
   their slack, once it has waited W_s (``starve_after_s``: STARVING); the
   one with the most slack first (the least harm to its own requests), then
   the one that has held its slice longest.

Every candidate must fit the model (HBM, bandwidth, SMs) and keep the active
set's C2C demand within the link budget once the victim's is removed.

``schedule_waiting`` routes every waiting model, higher priority first and
then oldest first, each against the slices as the earlier decisions of the
round left them. Serving the oldest first while each placement holds its
slice for Q bounds how long any model waits (``starvation_bound_s``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from planner.domain.serverless import (
    MigSlice,
    PreemptionParams,
    RouteDecision,
    ScheduledRoute,
    ServerlessModel,
    SliceState,
    WaitingModel,
)
from planner.policies.serverless.placement import fits

ACTIVE = "active"
IDLE = "idle"
EVICT = "evict"
QUEUE = "queue"

# Kinds of eviction candidates, in the order they are tried.
INACTIVE = "inactive"
LOWER_PRIORITY = "lower-priority"
HELD = "held"
STARVING = "starving"

_TOLERANCE = 1 + 1e-9


def _demand(slices: Sequence[SliceState], without: str = "") -> float:
    return sum(s.model_c2c_gbps for s in slices if s.model and s.id != without)


def _fits(model: ServerlessModel, state: SliceState) -> bool:
    return fits(model, MigSlice(state.id, state.profile))


def _held(state: SliceState, now_s: float, preemption: PreemptionParams) -> bool:
    return now_s - state.active_since_s >= preemption.min_hold_s


def eviction_order(
    model: ServerlessModel,
    slices: Sequence[SliceState],
    *,
    priority: float,
    link_budget_gbps: float,
    allow_preempt: bool = True,
    now_s: float = 0.0,
    waited_s: float = 0.0,
    preemption: PreemptionParams | None = None,
) -> list[tuple[SliceState, str]]:
    """The slices ``model`` may take from their models, best first, each
    with its kind (INACTIVE, LOWER_PRIORITY, HELD, STARVING); see the module
    doc."""
    budget = link_budget_gbps * _TOLERANCE
    candidates = [
        s
        for s in slices
        if s.model
        and s.model != model.name
        and _fits(model, s)
        and _demand(slices, without=s.id) + model.c2c_gbps <= budget
    ]
    inactive = sorted(
        (s for s in candidates if s.in_flight == 0),
        key=lambda s: (s.last_used_s, s.model_priority, s.id),
    )
    out = [(s, INACTIVE) for s in inactive]
    if not allow_preempt:
        return out
    busy = [s for s in candidates if s.in_flight > 0]
    lower = sorted(
        (s for s in busy if s.model_priority < priority),
        key=lambda s: (s.model_priority, s.in_flight, s.last_used_s, s.id),
    )
    out += [(s, LOWER_PRIORITY) for s in lower]
    if preemption is not None and waited_s >= preemption.preempt_after_s:
        starving = waited_s >= preemption.starving_after_s
        held = sorted(
            (
                s
                for s in busy
                if s.model_priority == priority
                and _held(s, now_s, preemption)
                and (starving or s.slack_s >= preemption.victim_slack_s)
            ),
            key=lambda s: (-s.slack_s, s.active_since_s, s.id),
        )
        out += [(s, HELD if s.slack_s >= preemption.victim_slack_s else STARVING) for s in held]
    return out


def route_request(
    model: ServerlessModel,
    slices: Sequence[SliceState],
    *,
    priority: float,
    link_budget_gbps: float,
    allow_preempt: bool = True,
    now_s: float = 0.0,
    waited_s: float = 0.0,
    preemption: PreemptionParams | None = None,
) -> RouteDecision:
    """Where one request for ``model`` runs, given every slice's state.

    ``priority``: the request's; an active model of strictly lower priority
    may be evicted (its in-flight requests are requeued by the engine) when
    ``allow_preempt``. With ``preemption``, a request whose model has waited
    ``waited_s`` >= W may also take a slice from an active model of equal
    priority that has held it for Q (measured at ``now_s``). Ties break on
    the slice id, so the answer is deterministic.
    """
    demand_now = _demand(slices)
    active = [s for s in slices if s.model == model.name]
    if active:
        best = min(active, key=lambda s: (s.in_flight, s.id))
        return RouteDecision(
            ACTIVE,
            best.id,
            "",
            demand_now,
            link_budget_gbps,
            f"{model.name} is active on {best.id} ({best.in_flight} in flight)",
        )
    budget = link_budget_gbps * _TOLERANCE
    idle = [
        s
        for s in slices
        if not s.model and _fits(model, s) and demand_now + model.c2c_gbps <= budget
    ]
    if idle:
        best = min(idle, key=lambda s: (s.profile.hbm_gbps, s.profile.sms, s.id))
        return RouteDecision(
            IDLE,
            best.id,
            "",
            demand_now + model.c2c_gbps,
            link_budget_gbps,
            f"idle slice {best.id} fits {model.name} (+{model.c2c_gbps:.1f} GB/s of C2C)",
        )
    order = eviction_order(
        model,
        slices,
        priority=priority,
        link_budget_gbps=link_budget_gbps,
        allow_preempt=allow_preempt,
        now_s=now_s,
        waited_s=waited_s,
        preemption=preemption,
    )
    if order:
        victim, kind = order[0]
        after = _demand(slices, without=victim.id) + model.c2c_gbps
        if kind == INACTIVE:
            why = (
                f"evict inactive {victim.model} from {victim.id} "
                f"(least recently used, last at {victim.last_used_s:g} s)"
            )
        elif kind == LOWER_PRIORITY:
            why = (
                f"evict {victim.model} from {victim.id}: priority {victim.model_priority:g} "
                f"< {priority:g} ({victim.in_flight} in flight to requeue)"
            )
        else:
            assert preemption is not None
            limit = preemption.preempt_after_s if kind == HELD else preemption.starving_after_s
            why = (
                f"preempt {victim.model} on {victim.id}: {model.name} waited {waited_s:.3g} s "
                f">= {limit:g} s{' (starving)' if kind == STARVING else ''} and "
                f"{victim.model} has held the slice {now_s - victim.active_since_s:.3g} s; "
                f"slack {victim.slack_s:.3g} s ({victim.in_flight} in flight to requeue)"
            )
        return RouteDecision(
            EVICT,
            victim.id,
            victim.model,
            after,
            link_budget_gbps,
            why,
            preempts=victim.in_flight > 0,
        )
    if not any(_fits(model, s) for s in slices):
        why = "fits no slice (HBM capacity, HBM bandwidth or SMs)"
    elif model.c2c_gbps > link_budget_gbps:
        why = f"needs {model.c2c_gbps:.1f} GB/s of C2C, over the budget {link_budget_gbps:.1f}"
    elif preemption is not None and allow_preempt and waited_s < preemption.preempt_after_s:
        why = (
            f"every fitting slice is busy; waited {waited_s:.3g} s "
            f"< {preemption.preempt_after_s:g} s before it may preempt"
        )
    else:
        why = (
            "every fitting slice is busy with a model of equal or higher priority "
            "(none has held its slice long enough, or with enough slack, to be "
            "preempted), or the link has no room"
        )
    return RouteDecision(QUEUE, "", "", demand_now, link_budget_gbps, f"queue: {why}")


def schedule_waiting(
    waiting: Sequence[WaitingModel],
    slices: Sequence[SliceState],
    *,
    now_s: float,
    link_budget_gbps: float,
    allow_preempt: bool = True,
    preemption: PreemptionParams | None = None,
) -> tuple[ScheduledRoute, ...]:
    """One decision per waiting model, in the order they are served: higher
    priority first, then the longest waiting, then the name. Each decision
    sees the slices as the earlier ones left them: a slice handed to a model
    runs it from now on (not yet ready there, so it cannot be taken again in
    this round) with its requests in flight."""
    names = [w.model.name for w in waiting]
    if len(set(names)) != len(names):
        raise ValueError("a model is listed twice among the waiting models")
    order = sorted(waiting, key=lambda w: (-w.priority, w.waiting_since_s, w.model.name))
    states = list(slices)
    out: list[ScheduledRoute] = []
    for w in order:
        d = route_request(
            w.model,
            states,
            priority=w.priority,
            link_budget_gbps=link_budget_gbps,
            allow_preempt=allow_preempt,
            now_s=now_s,
            waited_s=now_s - w.waiting_since_s,
            preemption=preemption,
        )
        out.append(ScheduledRoute(w.model.name, d))
        if d.action == QUEUE:
            continue
        i = next(k for k, s in enumerate(states) if s.id == d.slice_id)
        s = states[i]
        if d.action == ACTIVE:
            states[i] = dataclasses.replace(s, in_flight=s.in_flight + w.requests)
        else:
            states[i] = dataclasses.replace(
                s,
                model=w.model.name,
                model_c2c_gbps=w.model.c2c_gbps,
                model_priority=w.priority,
                in_flight=w.requests,
                last_used_s=now_s,
                active_since_s=math.inf,
                slack_s=math.inf,
            )
    return tuple(out)


def starvation_bound_s(
    *,
    ahead: int,
    usable_slices: int,
    preemption: PreemptionParams,
    iteration_s: float,
    switch_s: float,
) -> float:
    """The longest a model waits, from when its oldest request starts
    waiting until ``schedule_waiting`` hands it a slice, when every model has
    the same priority, fits every slice, and trading any active model for it
    keeps the link within budget, and the caller schedules at every
    iteration boundary:

        W_s + (ahead // S + 1) x (Q + switch_s + 2 x iteration_s)

    ``ahead``: models waiting since earlier (a model preempted off a slice
    waits again from then, so it queues behind); ``usable_slices`` S: slices
    that can be active at once (those that fit, at most the link budget over
    one model's demand). One slice's cycle: it is taken at an iteration
    boundary of its model (at most ``iteration_s`` after it became eligible),
    that iteration finishes (``iteration_s``), the switch takes ``switch_s``
    (KV out, setup, weight load), and the new model holds it for Q. Within
    any window of one cycle every slice is handed to a waiting model at
    least once, oldest first, so the model gets a slice within
    ``ahead // S + 1`` cycles of starting to starve (turning W_s old: from
    then on every slice that has held its model for Q is a candidate,
    whatever its slack).
    """
    if ahead < 0:
        raise ValueError(f"ahead must be >= 0, got {ahead}")
    if usable_slices <= 0:
        raise ValueError(f"usable_slices must be > 0, got {usable_slices}")
    for name, value in (("iteration_s", iteration_s), ("switch_s", switch_s)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    cycle = preemption.min_hold_s + switch_s + 2.0 * iteration_s
    return preemption.starving_after_s + (ahead // usable_slices + 1) * cycle
