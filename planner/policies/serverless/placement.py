"""Bandwidth-aware model placement on MIG slices (C2CServe §6.2, DESIGN.md
§3.5; our formulation).

Model m, CPU-resident, needs d_m = W_m / TPOT_m of C2C bandwidth while it
decodes. Decision x[m, s] = 1 when m is active on slice s; each model on at
most one slice (exactly one when required); at most K models per slice
(K = 1 by default: one active model per MIG instance); models sharing a slice
take turns, so slice s draws D_s = max_{m on s} d_m from the link.

- link: Σ_s D_s ≤ link bandwidth x utilization cap (every slice may stream
  at once);
- HBM capacity: Σ_{m on s} hbm_bytes_m ≤ HBM of s;
- fit: hbm_gbps_m ≤ HBM bandwidth of s and min_sms_m ≤ SMs of s (pairs that
  do not fit are fixed to 0).

Objective, lexicographic: first maximize the served weight Σ weight_m x_m,
then minimize the contention Σ_s D_s / budget + U, with U the largest
hbm_gbps_m / bandwidth_s among the assignments: serve the most valuable set,
then use the least link and keep the HBM-heavy models on the slices with
bandwidth to spare. Plans report one number, served - λ x contention (λ =
contention_weight x the smallest weight), and the greedy plan's.

Large footprints are kept apart: two models whose streams would overrun the
link together are never active on concurrent slices (with K > 1 they may
share a slice, where they take turns).

The greedy (most valuable first, onto the slice that adds the least link
demand, then the smallest slice that fits) is optimal when it places every
model and K = 1 on identical slices (the objective is then fixed); otherwise
the solver (planner.solvers, CP-SAT by default) runs from the greedy as warm
start within the time limit, and the greedy plan is returned when the
solver finds nothing better in time.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from planner.domain.serverless import (
    MigSlice,
    ModelAssignment,
    PlacementParams,
    PlacementPlan,
    ServerlessModel,
    SolveStats,
)
from planner.solvers import Model, SolverError, SolveResult, Status, VarType, solve

UNPLACED = -1
# Larger instances (models x slices) get the greedy only: building the model
# alone would take most of a request's budget.
MAX_SOLVER_PAIRS = 20_000
# Share of the time limit the first (served weight) stage may use.
STAGE_ONE_SHARE = 0.6
# The second stage keeps the served weight within this fraction of the first.
SERVED_TOLERANCE = 1e-9
Assignment = list[int]
"""Slice index per model, UNPLACED (-1) when the model is not active."""


def fits(model: ServerlessModel, mig: MigSlice) -> bool:
    """Whether the model may run on this slice at all (alone)."""
    p = mig.profile
    return (
        model.hbm_bytes <= p.hbm_bytes and model.hbm_gbps <= p.hbm_gbps and model.min_sms <= p.sms
    )


def _lambda(models: Sequence[ServerlessModel], params: PlacementParams) -> float:
    weights = [m.weight for m in models if m.weight > 0]
    return params.contention_weight * (min(weights) if weights else 1.0)


def link_demand_gbps(
    models: Sequence[ServerlessModel], slices: Sequence[MigSlice], assignment: Assignment
) -> float:
    per_slice = [0.0] * len(slices)
    for m, s in zip(models, assignment, strict=True):
        if s != UNPLACED:
            per_slice[s] = max(per_slice[s], m.c2c_gbps)
    return sum(per_slice)


def max_hbm_utilization(
    models: Sequence[ServerlessModel], slices: Sequence[MigSlice], assignment: Assignment
) -> float:
    return max(
        (
            m.hbm_gbps / slices[s].profile.hbm_gbps
            for m, s in zip(models, assignment, strict=True)
            if s != UNPLACED
        ),
        default=0.0,
    )


def violation(
    models: Sequence[ServerlessModel],
    slices: Sequence[MigSlice],
    assignment: Assignment,
    params: PlacementParams,
) -> str:
    """Why the assignment is not a valid plan ("" when it is)."""
    count = [0] * len(slices)
    hbm = [0] * len(slices)
    for m, s in zip(models, assignment, strict=True):
        if s == UNPLACED:
            if m.required:
                return f"required model {m.name} is not placed"
            continue
        if not fits(m, slices[s]):
            return f"{m.name} does not fit slice {slices[s].id}"
        count[s] += 1
        hbm[s] += m.hbm_bytes
    for i, mig in enumerate(slices):
        if count[i] > params.max_models_per_slice:
            return f"slice {mig.id} holds {count[i]} models (max {params.max_models_per_slice})"
        if hbm[i] > mig.profile.hbm_bytes:
            return f"slice {mig.id} needs {hbm[i]} HBM bytes of {mig.profile.hbm_bytes}"
    demand = link_demand_gbps(models, slices, assignment)
    if demand > params.link_budget_gbps * (1 + 1e-9):
        return f"link demand {demand:.1f} GB/s over the budget {params.link_budget_gbps:.1f}"
    return ""


def contention(
    models: Sequence[ServerlessModel],
    slices: Sequence[MigSlice],
    assignment: Assignment,
    params: PlacementParams,
) -> float:
    """The second objective (smaller is better): link demand / budget + the
    largest slice HBM-bandwidth utilization."""
    budget = params.link_budget_gbps
    link = link_demand_gbps(models, slices, assignment) / budget if budget > 0 else 0.0
    return link + max_hbm_utilization(models, slices, assignment)


def objective(
    models: Sequence[ServerlessModel],
    slices: Sequence[MigSlice],
    assignment: Assignment,
    params: PlacementParams,
) -> float:
    """One number for a valid assignment (larger is better): served weight -
    lambda x contention. The solver optimizes the two lexicographically."""
    served = sum(m.weight for m, s in zip(models, assignment, strict=True) if s != UNPLACED)
    return served - _lambda(models, params) * contention(models, slices, assignment, params)


def greedy_assignment(
    models: Sequence[ServerlessModel], slices: Sequence[MigSlice], params: PlacementParams
) -> Assignment:
    """Required models first, then by weight (descending), then by demand
    (ascending); each onto the fitting slice that adds the least link demand,
    then the smallest (bandwidth, SMs), then the first."""
    order = sorted(
        range(len(models)),
        key=lambda i: (not models[i].required, -models[i].weight, models[i].c2c_gbps, i),
    )
    assignment = [UNPLACED] * len(models)
    count = [0] * len(slices)
    hbm = [0] * len(slices)
    drawn = [0.0] * len(slices)
    budget = params.link_budget_gbps * (1 + 1e-9)
    for i in order:
        m = models[i]
        best: tuple[float, float, int, int] | None = None
        for s, mig in enumerate(slices):
            if count[s] >= params.max_models_per_slice or not fits(m, mig):
                continue
            if hbm[s] + m.hbm_bytes > mig.profile.hbm_bytes:
                continue
            added = max(0.0, m.c2c_gbps - drawn[s])
            if sum(drawn) + added > budget:
                continue
            key = (added, mig.profile.hbm_gbps, mig.profile.sms, s)
            if best is None or key < best:
                best = key
        if best is None:
            continue
        s = best[3]
        assignment[i] = s
        count[s] += 1
        hbm[s] += m.hbm_bytes
        drawn[s] = max(drawn[s], m.c2c_gbps)
    return assignment


def _greedy_is_optimal(
    models: Sequence[ServerlessModel],
    slices: Sequence[MigSlice],
    assignment: Assignment,
    params: PlacementParams,
) -> bool:
    if params.max_models_per_slice != 1 or UNPLACED in assignment:
        return False
    first = slices[0].profile if slices else None
    return all(s.profile == first for s in slices)


def _build(
    models: Sequence[ServerlessModel],
    slices: Sequence[MigSlice],
    params: PlacementParams,
    served_floor: float | None,
) -> tuple[Model, npt.NDArray[np.int64], npt.NDArray[np.int64] | None, int | None]:
    """The placement model. Without a floor: maximize the served weight.
    With one: keep the served weight >= floor and minimize the contention
    (link demand / budget + max slice HBM utilization). Returns the model,
    x (models x (slices + 1), the last column "not placed"), the per-slice
    link draws D (K > 1) and U."""
    n_m, n_s = len(models), len(slices)
    k = params.max_models_per_slice
    m = Model("serverless-placement")
    ub = np.ones((n_m, n_s + 1))
    for i, model in enumerate(models):
        for s, mig in enumerate(slices):
            if not fits(model, mig):
                ub[i, s] = 0.0
        if model.required:
            ub[i, n_s] = 0.0
    x = m.add_vars(n_m * (n_s + 1), VarType.BINARY, 0.0, ub.ravel()).reshape(n_m, n_s + 1)
    m.add_exactly_one_groups(x)
    xs = x[:, :n_s]
    d = np.array([model.c2c_gbps for model in models])
    hbm_gb = np.array([model.hbm_bytes / 1e9 for model in models])
    weights = np.array([model.weight for model in models])
    budget = params.link_budget_gbps
    if k < n_m:
        for s in range(n_s):
            m.add_linear(xs[:, s], 1.0, "<=", k)
    for s, mig in enumerate(slices):
        cap = mig.profile.hbm_bytes / 1e9
        if k > 1 and hbm_gb.sum() > cap:
            m.add_linear(xs[:, s], hbm_gb, "<=", cap)
    drawn: npt.NDArray[np.int64] | None = None
    if k == 1:
        # One model per slice: the link row is linear in x.
        m.add_linear(xs.ravel(), np.repeat(d, n_s), "<=", budget)
    else:
        drawn = m.add_continuous(n_s, 0.0, max(float(d.max()), 1e-9))
        # D_s >= d_m x[m, s], one sparse row per pair that may be chosen.
        for i in range(n_m):
            for s in range(n_s):
                if ub[i, s] > 0 and d[i] > 0:
                    m.add_linear([drawn[s], xs[i, s]], [1.0, -d[i]], ">=", 0.0)
        m.add_linear(drawn, 1.0, "<=", budget)
    if served_floor is None:
        m.maximize(xs.ravel(), np.repeat(weights, n_s))
        return m, x, drawn, None
    m.add_linear(xs.ravel(), np.repeat(weights, n_s), ">=", served_floor)
    ratio = np.array(
        [[model.hbm_gbps / mig.profile.hbm_gbps for mig in slices] for model in models]
    )
    u = m.add_continuous(1, 0.0, 1.0)[0]
    # U >= sum_s ratio[m, s] x[m, s]: a model is on at most one slice, so the
    # sum is its own slice's ratio (one row per model, not per pair).
    for i in range(n_m):
        if ratio[i].max() > 0:
            m.add_linear(np.append(u, xs[i]), np.append(1.0, -ratio[i]), ">=", 0.0)
    if drawn is None:
        m.minimize(np.append(xs.ravel(), u), np.append(np.repeat(d, n_s) / budget, 1.0))
    else:
        m.minimize(np.append(drawn, u), np.append(np.full(n_s, 1.0 / budget), 1.0))
    return m, x, drawn, int(u)


def _hint(
    models: Sequence[ServerlessModel],
    slices: Sequence[MigSlice],
    assignment: Assignment,
    x: npt.NDArray[np.int64],
    *,
    drawn: npt.NDArray[np.int64] | None,
    u: int | None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    n_s = len(slices)
    values = np.zeros(x.shape)
    for i, s in enumerate(assignment):
        values[i, n_s if s == UNPLACED else s] = 1.0
    ids = [x.ravel()]
    vals = [values.ravel()]
    if drawn is not None:
        ids.append(drawn)
        vals.append(
            np.array(
                [
                    max(
                        (models[i].c2c_gbps for i, s in enumerate(assignment) if s == j),
                        default=0.0,
                    )
                    for j in range(n_s)
                ]
            )
        )
    if u is not None:
        ids.append(np.array([u]))
        vals.append(np.array([max_hbm_utilization(models, slices, assignment)]))
    return np.concatenate(ids), np.concatenate(vals)


def _stats(results: list[SolveResult], limit: float) -> SolveStats:
    """One record for the two stages: the first stage's objective and bound
    (served weight), the statuses joined, the wall time summed."""
    first = results[0]
    statuses = [str(r.status) for r in results]
    status = (
        "OPTIMAL"
        if all(s == "OPTIMAL" for s in statuses)
        else ("FEASIBLE" if all(r.has_solution for r in results) else statuses[-1])
    )
    gap = first.gap
    return SolveStats(
        backend=str(results[-1].backend),
        status=status,
        objective=first.objective,
        best_bound=first.best_bound,
        gap=gap if gap is not None and math.isfinite(gap) else None,
        wall_s=sum(r.wall_time_s for r in results),
        time_limit_s=limit,
        note="; ".join(r.note for r in results if r.note),
    )


def _solver_assignment(
    models: Sequence[ServerlessModel],
    slices: Sequence[MigSlice],
    params: PlacementParams,
    warm: Assignment,
) -> tuple[Assignment | None, SolveStats]:
    """Lexicographic: stage 1 maximizes the served weight, stage 2 keeps it
    and minimizes the contention (two solves keep both objectives' scales
    apart; one weighted objective blurred the small contention term under
    CP-SAT's coefficient scaling)."""
    # A backend that cannot take the model (gurobipy missing or over its
    # licence, too many assignments to enumerate) hands over to CP-SAT.
    fallback = "cpsat" if params.backend != "cpsat" else None
    started = time.perf_counter()
    deadline = started + params.time_limit_s
    try:
        return _two_stages(models, slices, params, warm, deadline=deadline, fallback=fallback)
    except SolverError as exc:
        note = f"{type(exc).__name__}: {exc}"
        return None, SolveStats(
            params.backend,
            "ERROR",
            None,
            None,
            None,
            time.perf_counter() - started,
            params.time_limit_s,
            note,
        )


def _two_stages(
    models: Sequence[ServerlessModel],
    slices: Sequence[MigSlice],
    params: PlacementParams,
    warm: Assignment,
    *,
    deadline: float,
    fallback: str | None,
) -> tuple[Assignment | None, SolveStats]:
    n_s = len(slices)
    m1, x1, d1, u1 = _build(models, slices, params, None)
    r1 = solve(
        m1,
        time_limit_s=params.time_limit_s * STAGE_ONE_SHARE,
        backend=params.backend,
        fallback=fallback,
        hint=_hint(models, slices, warm, x1, drawn=d1, u=u1),
    )
    if r1.status not in (Status.OPTIMAL, Status.FEASIBLE) or not r1.has_solution:
        return None, _stats([r1], params.time_limit_s)
    first = [UNPLACED if int(c) == n_s else int(c) for c in r1.value(x1).argmax(axis=1)]
    served = sum(models[i].weight for i, s in enumerate(first) if s != UNPLACED)
    floor = served - SERVED_TOLERANCE * max(1.0, abs(served))
    m2, x2, d2, u2 = _build(models, slices, params, floor)
    r2 = solve(
        m2,
        time_limit_s=max(deadline - time.perf_counter(), 1e-3),
        backend=params.backend,
        fallback=fallback,
        hint=_hint(models, slices, first, x2, drawn=d2, u=u2),
    )
    stats = _stats([r1, r2], params.time_limit_s)
    if r2.status not in (Status.OPTIMAL, Status.FEASIBLE) or not r2.has_solution:
        return first, stats
    return [UNPLACED if int(c) == n_s else int(c) for c in r2.value(x2).argmax(axis=1)], stats


def _plan(
    models: Sequence[ServerlessModel],
    slices: Sequence[MigSlice],
    assignment: Assignment,
    params: PlacementParams,
    *,
    greedy_objective: float,
    source: str,
    solve_stats: SolveStats | None,
) -> PlacementPlan:
    bad = violation(models, slices, assignment, params)
    assignments = tuple(
        ModelAssignment(m.name, slices[s].id, m.c2c_gbps)
        for m, s in zip(models, assignment, strict=True)
        if s != UNPLACED
    )
    unplaced = tuple(
        (m.name, _why_unplaced(m, slices, params))
        for m, s in zip(models, assignment, strict=True)
        if s == UNPLACED
    )
    demand = link_demand_gbps(models, slices, assignment)
    value = objective(models, slices, assignment, params)
    feasible = not bad
    summary = (
        f"{len(assignments)}/{len(models)} models active on {len(slices)} slices; "
        f"link {demand:.1f} of {params.link_budget_gbps:.1f} GB/s; source {source}"
    )
    if bad:
        summary += f"; infeasible: {bad}"
    return PlacementPlan(
        assignments=assignments,
        unplaced=unplaced,
        link_demand_gbps=demand,
        link_budget_gbps=params.link_budget_gbps,
        max_slice_hbm_utilization=max_hbm_utilization(models, slices, assignment),
        served_weight=sum(m.weight for m, s in zip(models, assignment, strict=True) if s >= 0),
        objective=value,
        greedy_objective=greedy_objective,
        source=source if feasible else "infeasible",
        feasible=feasible,
        solve=solve_stats,
        summary=summary,
    )


def _why_unplaced(
    model: ServerlessModel, slices: Sequence[MigSlice], params: PlacementParams
) -> str:
    if not any(fits(model, s) for s in slices):
        return "fits no slice (HBM capacity, HBM bandwidth or SMs)"
    if model.c2c_gbps > params.link_budget_gbps:
        return (
            f"needs {model.c2c_gbps:.1f} GB/s of C2C, over the link budget "
            f"{params.link_budget_gbps:.1f}"
        )
    return "no slice or link budget left for it (higher-value models placed first)"


def lexicographic_key(
    models: Sequence[ServerlessModel],
    slices: Sequence[MigSlice],
    assignment: Assignment,
    params: PlacementParams,
) -> tuple[float, float]:
    """(served weight, -contention), rounded so that solver noise does not
    order equal plans: larger is better."""
    served = sum(m.weight for m, s in zip(models, assignment, strict=True) if s != UNPLACED)
    return round(served, 9), -round(contention(models, slices, assignment, params), 9)


_key = lexicographic_key


def plan_placement(
    models: Sequence[ServerlessModel],
    slices: Sequence[MigSlice],
    params: PlacementParams,
) -> PlacementPlan:
    """The active set and its slices; see the module docstring."""
    greedy = greedy_assignment(models, slices, params)
    greedy_value = objective(models, slices, greedy, params)
    greedy_valid = not violation(models, slices, greedy, params)
    if params.method == "greedy" or not models or not slices:
        return _plan(
            models,
            slices,
            greedy,
            params,
            greedy_objective=greedy_value,
            source="greedy",
            solve_stats=None,
        )
    if (
        params.method == "auto"
        and greedy_valid
        and _greedy_is_optimal(models, slices, greedy, params)
    ):
        return _plan(
            models,
            slices,
            greedy,
            params,
            greedy_objective=greedy_value,
            source="greedy-proven",
            solve_stats=None,
        )
    if len(models) * len(slices) > MAX_SOLVER_PAIRS:
        plan = _plan(
            models,
            slices,
            greedy,
            params,
            greedy_objective=greedy_value,
            source="greedy",
            solve_stats=None,
        )
        why = f"; {len(models)} x {len(slices)} pairs > {MAX_SOLVER_PAIRS}: greedy only"
        return dataclasses.replace(plan, summary=plan.summary + why)
    found, stats = _solver_assignment(models, slices, params, greedy)
    if (
        found is not None
        and not violation(models, slices, found, params)
        and (
            not greedy_valid
            or _key(models, slices, found, params) >= _key(models, slices, greedy, params)
        )
    ):
        return _plan(
            models,
            slices,
            found,
            params,
            greedy_objective=greedy_value,
            source="solver",
            solve_stats=stats,
        )
    return _plan(
        models,
        slices,
        greedy,
        params,
        greedy_objective=greedy_value,
        source="greedy-fallback",
        solve_stats=stats,
    )
