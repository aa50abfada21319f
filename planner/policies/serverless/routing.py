"""Per-request routing (C2CServe §6.1) and the queue-aware scheduling of the
models waiting for a slice.

Slices are given as ``SliceState`` entries: one per model resident on a
slice (a slice with several resident models, which take turns iteration by
iteration, appears once per model, with the same id and profile), or one
entry with no model for an idle slice.

``route_request``, for one request, tries in order:

1. ACTIVE: a slice where its model is resident (the least loaded);
2. IDLE: an idle slice that fits within the link budget (the smallest);
3. EVICT an inactive model (nothing in flight), least recently used first;
4. SHARE: with ``max_models_per_slice`` K > 1, become one more resident of
   a slice with fewer than K whose residents, with the ``requests`` the
   model brings, have at most ``share_max_in_flight`` requests in flight
   together (the fewest
   residents, then the fewest requests in flight), within the link budget:
   its residents then take
   turns, so each model's decode gets a token every k iterations, and the
   link budget counts every resident's demand W / TPOT (a slice of k
   residents draws k of them to keep each one's TPOT);
5. EVICT a model of lower priority than the request (its in-flight
   requests are requeued), lowest priority first;
6. with ``PreemptionParams``, EVICT an active model of equal priority that
   has been ready for at least Q (``min_hold_s``): HELD when the waiting
   model is urgent (its most urgent request has at most U of slack,
   ``urgent_slack_s``) and every request of the victim has at least V
   (``victim_slack_s``), its requests preempted (requeued, KV to host);
   STARVING, whatever the slack, when the waiting model has waited W_s
   (``starve_after_s``), by draining the victim (no new requests; the
   place is handed over once its requests in flight are done, or after D,
   ``max_drain_s``, preempting the rest). HELD victims: the one with the
   most slack first (the least harm to its own requests), then the one
   ready longest; STARVING: the one with the fewest requests in flight
   first (the least work disturbed: a rare model rather than a hot one),
   then the most slack;
7. else QUEUE, saying why.

Every candidate must fit the model (HBM, bandwidth, SMs) and keep the
resident set's C2C demand within the link budget once the victim's is
removed. ``eviction_order`` lists steps 3, 5 and 6.

``schedule_waiting`` routes every waiting model, each against the slices as
the earlier decisions of the round left them: higher priority first; then
the starving models, oldest first; then the others, least slack first.
Serving starving models oldest first while each placement holds its slot
for Q bounds how long any model waits (``starvation_bound_s``).
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
SHARE = "share"
EVICT = "evict"
QUEUE = "queue"

# Kinds of eviction candidates, in the order they are tried.
INACTIVE = "inactive"
LOWER_PRIORITY = "lower-priority"
HELD = "held"
STARVING = "starving"

_TOLERANCE = 1 + 1e-9


def _demand(slices: Sequence[SliceState], without: SliceState | None = None) -> float:
    return sum(s.model_c2c_gbps for s in slices if s.model and s is not without)


def _fits(model: ServerlessModel, state: SliceState) -> bool:
    return fits(model, MigSlice(state.id, state.profile))


def _held(state: SliceState, now_s: float, preemption: PreemptionParams) -> bool:
    return now_s - state.active_since_s >= preemption.min_hold_s


def residents(slices: Sequence[SliceState]) -> dict[str, list[SliceState]]:
    """The entries of each slice id (in the order given), models only."""
    out: dict[str, list[SliceState]] = {}
    for s in slices:
        out.setdefault(s.id, [])
        if s.model:
            out[s.id].append(s)
    return out


def check_slices(slices: Sequence[SliceState], max_models_per_slice: int) -> None:
    """Raises ValueError when the entries do not describe slices: an id
    listed twice with no model or the same model, with different profiles,
    or with more residents than ``max_models_per_slice``."""
    if max_models_per_slice < 1:
        raise ValueError(f"max_models_per_slice must be >= 1, got {max_models_per_slice}")
    seen: dict[str, list[SliceState]] = {}
    for s in slices:
        seen.setdefault(s.id, []).append(s)
    for sid, entries in seen.items():
        if len(entries) == 1:
            continue
        models = [e.model for e in entries]
        if "" in models or len(set(models)) != len(models):
            raise ValueError(f"slice {sid!r} is listed twice with no model or the same model")
        if len({e.profile for e in entries}) != 1:
            raise ValueError(f"slice {sid!r} is listed with different profiles")
        if len(entries) > max_models_per_slice:
            raise ValueError(
                f"slice {sid!r} has {len(entries)} models, more than "
                f"max_models_per_slice {max_models_per_slice}"
            )


def eviction_order(
    model: ServerlessModel,
    slices: Sequence[SliceState],
    *,
    priority: float,
    link_budget_gbps: float,
    allow_preempt: bool = True,
    now_s: float = 0.0,
    waited_s: float = 0.0,
    waiter_slack_s: float = math.inf,
    preemption: PreemptionParams | None = None,
) -> list[tuple[SliceState, str]]:
    """The resident models ``model`` may take the place of, best first, each
    with its kind (INACTIVE, LOWER_PRIORITY, HELD, STARVING); see the module
    doc."""
    budget = link_budget_gbps * _TOLERANCE
    total = _demand(slices)
    candidates = [
        s
        for s in slices
        if s.model
        and s.model != model.name
        and total - s.model_c2c_gbps + model.c2c_gbps <= budget
        and _fits(model, s)
    ]
    inactive = sorted(
        (s for s in candidates if s.in_flight == 0),
        key=lambda s: (s.last_used_s, s.model_priority, s.id, s.model),
    )
    out = [(s, INACTIVE) for s in inactive]
    if not allow_preempt:
        return out
    busy = [s for s in candidates if s.in_flight > 0]
    lower = sorted(
        (s for s in busy if s.model_priority < priority),
        key=lambda s: (s.model_priority, s.in_flight, s.last_used_s, s.id, s.model),
    )
    out += [(s, LOWER_PRIORITY) for s in lower]
    if preemption is None:
        return out
    starving = waited_s >= preemption.starve_after_s
    urgent = waiter_slack_s <= preemption.urgent_slack_s
    if not (starving or urgent):
        return out
    held = [s for s in busy if s.model_priority == priority and _held(s, now_s, preemption)]
    with_slack = [s for s in held if s.slack_s >= preemption.victim_slack_s]
    if urgent:
        out += [
            (s, HELD)
            for s in sorted(with_slack, key=lambda s: (-s.slack_s, s.active_since_s, s.id, s.model))
        ]
    if starving:
        taken = {(s.id, s.model) for s, _ in out}
        drain = sorted(
            (s for s in held if (s.id, s.model) not in taken),
            key=lambda s: (s.in_flight, -s.slack_s, s.active_since_s, s.id, s.model),
        )
        out += [(s, STARVING) for s in drain]
    return out


def _share_slice(
    model: ServerlessModel,
    slices: Sequence[SliceState],
    budget: float,
    *,
    max_models_per_slice: int,
    share_max_in_flight: float,
    requests: int,
) -> str | None:
    if max_models_per_slice <= 1 or _demand(slices) + model.c2c_gbps > budget:
        return None
    options = []
    for sid, on in residents(slices).items():
        light = sum(s.in_flight for s in on) + requests <= share_max_in_flight
        if on and light and len(on) < max_models_per_slice and _fits(model, on[0]):
            options.append((len(on), sum(s.in_flight for s in on), sid))
    return min(options)[2] if options else None


def route_request(
    model: ServerlessModel,
    slices: Sequence[SliceState],
    *,
    priority: float,
    link_budget_gbps: float,
    allow_preempt: bool = True,
    now_s: float = 0.0,
    waited_s: float = 0.0,
    slack_s: float = math.inf,
    preemption: PreemptionParams | None = None,
    max_models_per_slice: int = 1,
    share_max_in_flight: float = math.inf,
    requests: int = 1,
) -> RouteDecision:
    """Where one request for ``model`` runs, given every slice's state (one
    entry per resident model; see the module doc).

    ``priority``: the request's; an active model of strictly lower priority
    may be evicted (its in-flight requests are requeued by the engine) when
    ``allow_preempt``. With ``preemption``, a request whose model has waited
    ``waited_s`` and whose most urgent waiting request has ``slack_s`` left
    may also take the place of an active model of equal priority that has
    been ready for Q (measured at ``now_s``; see ``eviction_order``). Ties
    break on the slice id, so the answer is deterministic.
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
        waiter_slack_s=slack_s,
        preemption=preemption,
    )
    numbers = {
        "link_budget_gbps": link_budget_gbps,
        "now_s": now_s,
        "waited_s": waited_s,
        "slack_s": slack_s,
    }
    if order and order[0][1] == INACTIVE:
        return _evict(model, slices, order[0], **numbers)
    shared = _share_slice(
        model,
        slices,
        budget,
        max_models_per_slice=max_models_per_slice,
        share_max_in_flight=share_max_in_flight,
        requests=requests,
    )
    if shared is not None:
        on = residents(slices)[shared]
        return RouteDecision(
            SHARE,
            shared,
            "",
            demand_now + model.c2c_gbps,
            link_budget_gbps,
            f"share {shared} with {', '.join(s.model for s in on)} "
            f"({len(on) + 1} models take turns; +{model.c2c_gbps:.1f} GB/s of C2C)",
        )
    if order:
        return _evict(model, slices, order[0], **numbers)
    if not any(_fits(model, s) for s in slices):
        why = "fits no slice (HBM capacity, HBM bandwidth or SMs)"
    elif model.c2c_gbps > link_budget_gbps:
        why = f"needs {model.c2c_gbps:.1f} GB/s of C2C, over the budget {link_budget_gbps:.1f}"
    elif (
        preemption is not None
        and allow_preempt
        and slack_s > preemption.urgent_slack_s
        and waited_s < preemption.starve_after_s
    ):
        why = (
            f"every fitting slice is busy; slack {slack_s:.3g} s > "
            f"{preemption.urgent_slack_s:g} s and waited {waited_s:.3g} s < "
            f"{preemption.starve_after_s:g} s: not yet allowed to preempt"
        )
    else:
        why = (
            "every fitting slice is busy with a model of equal or higher priority "
            "(none has held its slice long enough, or with enough slack, to be "
            "preempted), or the link has no room"
        )
    return RouteDecision(QUEUE, "", "", demand_now, link_budget_gbps, f"queue: {why}")


def _evict(
    model: ServerlessModel,
    slices: Sequence[SliceState],
    choice: tuple[SliceState, str],
    *,
    link_budget_gbps: float,
    now_s: float,
    waited_s: float,
    slack_s: float,
) -> RouteDecision:
    victim, kind = choice
    after = _demand(slices, without=victim) + model.c2c_gbps
    held_for = now_s - victim.active_since_s
    if kind == INACTIVE:
        why = (
            f"evict inactive {victim.model} from {victim.id} "
            f"(least recently used, last at {victim.last_used_s:g} s)"
        )
    elif kind == LOWER_PRIORITY:
        why = (
            f"evict {victim.model} from {victim.id}: priority {victim.model_priority:g} "
            f"< the request's ({victim.in_flight} in flight to requeue)"
        )
    elif kind == HELD:
        why = (
            f"preempt {victim.model} on {victim.id}: {model.name} is urgent (slack "
            f"{slack_s:.3g} s), {victim.model} has been ready {held_for:.3g} s with "
            f"slack {victim.slack_s:.3g} s ({victim.in_flight} in flight to requeue)"
        )
    else:
        why = (
            f"drain {victim.model} on {victim.id}: {model.name} is starving (waited "
            f"{waited_s:.3g} s), {victim.model} has been ready {held_for:.3g} s; it takes "
            f"no new requests and its {victim.in_flight} in flight finish first"
        )
    drains = kind == STARVING and victim.in_flight > 0
    return RouteDecision(
        EVICT,
        victim.id,
        victim.model,
        after,
        link_budget_gbps,
        why,
        preempts=victim.in_flight > 0 and not drains,
        eviction=kind,
        drains=drains,
    )


def service_order(
    waiting: Sequence[WaitingModel], *, now_s: float, preemption: PreemptionParams | None
) -> list[WaitingModel]:
    """Higher priority first; then the starving models (waited W_s),
    oldest first; then the others, least slack first (oldest first without
    preemption parameters); ties on the name."""

    def key(w: WaitingModel) -> tuple[float, int, float, float, str]:
        waited = now_s - w.waiting_since_s
        if preemption is None or waited >= preemption.starve_after_s:
            return (-w.priority, 0, w.waiting_since_s, 0.0, w.model.name)
        return (-w.priority, 1, w.slack_s, w.waiting_since_s, w.model.name)

    return sorted(waiting, key=key)


def schedule_waiting(
    waiting: Sequence[WaitingModel],
    slices: Sequence[SliceState],
    *,
    now_s: float,
    link_budget_gbps: float,
    allow_preempt: bool = True,
    preemption: PreemptionParams | None = None,
    max_models_per_slice: int = 1,
    share_max_in_flight: float = math.inf,
    no_share: frozenset[str] = frozenset(),
) -> tuple[ScheduledRoute, ...]:
    """One decision per waiting model, in ``service_order``. Each decision
    sees the slices as the earlier ones left them: a model handed a place
    runs there from now on (not yet ready, so it cannot be displaced again
    in this round) with its requests in flight. The models in ``no_share``
    do not share a slice in this round (a share just ended for them:
    ``end_share``)."""
    names = [w.model.name for w in waiting]
    if len(set(names)) != len(names):
        raise ValueError("a model is listed twice among the waiting models")
    check_slices(slices, max_models_per_slice)
    states = list(slices)
    out: list[ScheduledRoute] = []
    for w in service_order(waiting, now_s=now_s, preemption=preemption):
        d = route_request(
            w.model,
            states,
            priority=w.priority,
            link_budget_gbps=link_budget_gbps,
            allow_preempt=allow_preempt,
            now_s=now_s,
            waited_s=now_s - w.waiting_since_s,
            slack_s=w.slack_s,
            preemption=preemption,
            max_models_per_slice=1 if w.model.name in no_share else max_models_per_slice,
            share_max_in_flight=share_max_in_flight,
            requests=w.requests,
        )
        out.append(ScheduledRoute(w.model.name, d))
        if d.action == QUEUE:
            continue
        if d.action == ACTIVE:
            i = next(
                k for k, s in enumerate(states) if s.id == d.slice_id and s.model == w.model.name
            )
            states[i] = dataclasses.replace(states[i], in_flight=states[i].in_flight + w.requests)
            continue
        if d.action == SHARE:
            i = next(k for k, s in enumerate(states) if s.id == d.slice_id)
            states.append(_placed(states[i], w, now_s))
            continue
        # IDLE: the idle entry; EVICT: the victim's.
        i = next(
            k for k, s in enumerate(states) if s.id == d.slice_id and s.model == d.evicted_model
        )
        states[i] = _placed(states[i], w, now_s)
    return tuple(out)


def _placed(slot: SliceState, w: WaitingModel, now_s: float) -> SliceState:
    return dataclasses.replace(
        slot,
        model=w.model.name,
        model_c2c_gbps=w.model.c2c_gbps,
        model_priority=w.priority,
        in_flight=w.requests,
        last_used_s=now_s,
        active_since_s=math.inf,
        slack_s=math.inf,
    )


def starvation_bound_s(
    *,
    ahead: int,
    usable_slices: int,
    preemption: PreemptionParams,
    iteration_s: float,
    switch_s: float,
    drain_s: float = 0.0,
) -> float:
    """The longest a model waits, from when its oldest request starts
    waiting until ``schedule_waiting`` hands it a place, when every model has
    the same priority, fits every slice, and trading any resident model for
    it keeps the link within budget, and the caller schedules at every
    iteration boundary:

        W_s + (ahead // S + 1) x (Q + drain_s + switch_s + 2 x iteration_s)

    ``ahead``: models waiting since earlier (a model preempted off a slice
    waits again from then, so it queues behind); ``usable_slices`` S: places
    that can be active at once (slices that fit times the models each may
    hold, at most the link budget over one model's demand). One place's
    cycle: it is handed over at an iteration boundary (at most
    ``iteration_s`` after it became eligible), its model's requests in
    flight finish (at most ``drain_s``: the drain limit D, or their
    longest remaining decode if shorter) and its iteration in progress
    (``iteration_s``), the switch takes
    ``switch_s`` (set-up, weight load), and the new model holds it for Q.
    Within any window of one cycle every place is handed to a waiting
    model at least once, starving models oldest first, so a model gets one
    within ``ahead // S + 1`` cycles of starting to starve (turning W_s
    old: from then on every place whose model has been ready for Q is a
    candidate, whatever its slack).
    """
    if ahead < 0:
        raise ValueError(f"ahead must be >= 0, got {ahead}")
    if usable_slices <= 0:
        raise ValueError(f"usable_slices must be > 0, got {usable_slices}")
    if not math.isfinite(preemption.starve_after_s):
        raise ValueError("no bound without a starvation backstop (starve_after_s is inf)")
    for name, value in (
        ("iteration_s", iteration_s),
        ("switch_s", switch_s),
        ("drain_s", drain_s),
    ):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    cycle = preemption.min_hold_s + drain_s + switch_s + 2.0 * iteration_s
    return preemption.starve_after_s + (ahead // usable_slices + 1) * cycle
