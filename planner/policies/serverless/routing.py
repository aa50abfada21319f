"""Per-request routing (C2CServe §6.1): to a slice where the model is
active; else onto an idle slice that fits within the link budget; else evict
an inactive model (least recently used first) or, failing that, the active
model of lowest priority below the request's; else queue."""

from __future__ import annotations

from collections.abc import Sequence

from planner.domain.serverless import MigSlice, RouteDecision, ServerlessModel, SliceState
from planner.policies.serverless.placement import fits

ACTIVE = "active"
IDLE = "idle"
EVICT = "evict"
QUEUE = "queue"


def _demand(slices: Sequence[SliceState], without: str = "") -> float:
    return sum(s.model_c2c_gbps for s in slices if s.model and s.id != without)


def _fits(model: ServerlessModel, state: SliceState) -> bool:
    return fits(model, MigSlice(state.id, state.profile))


def route_request(
    model: ServerlessModel,
    slices: Sequence[SliceState],
    *,
    priority: float,
    link_budget_gbps: float,
    allow_preempt: bool = True,
) -> RouteDecision:
    """Where one request for ``model`` runs, given every slice's state.

    ``priority``: the request's; an active model of strictly lower priority
    may be evicted (its in-flight requests are requeued by the engine) when
    ``allow_preempt``. Ties break on the slice id, so the answer is
    deterministic.
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
    budget = link_budget_gbps * (1 + 1e-9)
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

    def after(s: SliceState) -> float:
        return _demand(slices, without=s.id) + model.c2c_gbps

    candidates = [s for s in slices if s.model and _fits(model, s) and after(s) <= budget]
    inactive = [s for s in candidates if s.in_flight == 0]
    if inactive:
        victim = min(inactive, key=lambda s: (s.last_used_s, s.model_priority, s.id))
        return RouteDecision(
            EVICT,
            victim.id,
            victim.model,
            after(victim),
            link_budget_gbps,
            f"evict inactive {victim.model} from {victim.id} "
            f"(least recently used, last at {victim.last_used_s:g} s)",
        )
    lower = [s for s in candidates if s.model_priority < priority]
    if allow_preempt and lower:
        victim = min(lower, key=lambda s: (s.model_priority, s.in_flight, s.last_used_s, s.id))
        return RouteDecision(
            EVICT,
            victim.id,
            victim.model,
            after(victim),
            link_budget_gbps,
            f"evict {victim.model} from {victim.id}: priority {victim.model_priority:g} "
            f"< {priority:g} ({victim.in_flight} in flight to requeue)",
        )
    if not any(_fits(model, s) for s in slices):
        why = "fits no slice (HBM capacity, HBM bandwidth or SMs)"
    elif model.c2c_gbps > link_budget_gbps:
        why = f"needs {model.c2c_gbps:.1f} GB/s of C2C, over the budget {link_budget_gbps:.1f}"
    else:
        why = (
            "every fitting slice is busy with a model of equal or higher priority, "
            "or the link has no room"
        )
    return RouteDecision(QUEUE, "", "", demand_now, link_budget_gbps, f"queue: {why}")
