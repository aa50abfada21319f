"""`solve`: one entry point for every backend, with a deadline, a warm start
and an optional fallback."""

from __future__ import annotations

import math
import time

import numpy as np
import numpy.typing as npt

from .backends import SOLVER_BACKENDS
from .continuous import fill_continuous, plan_continuous
from .errors import BackendUnavailableError, ModelTooLargeError, UnsupportedModelError
from .frozen import FEASIBILITY_TOL, FloatArray, VarType
from .model import Model
from .options import SolveOptions
from .outcome import Outcome
from .result import Backend, SolveResult, Status

Hint = SolveResult | tuple[npt.ArrayLike, npt.ArrayLike] | npt.ArrayLike
"""A warm start: a previous SolveResult, (var ids, values), or one value per
variable (NaN where unknown)."""

_FALLBACK_ERRORS = (BackendUnavailableError, ModelTooLargeError, UnsupportedModelError)
MIN_BACKEND_TIME_S = 1e-4
"""A backend is always given at least this much time."""

AUTO = "auto"
"""`backend="auto"`: Gurobi when installed and the model fits its licence,
else CP-SAT (said in the note)."""


def available_backends() -> list[Backend]:
    """Backends whose packages import here (exhaustive and the branch and
    bound always do)."""
    return [b.backend for b in SOLVER_BACKENDS.values() if b.present]


def solve(
    model: Model,
    *,
    time_limit_s: float,
    backend: Backend | str = Backend.CPSAT,
    fallback: Backend | str | None = None,
    hint: Hint | None = None,
    options: SolveOptions | None = None,
) -> SolveResult:
    """Solve `model` within `time_limit_s` (the whole call: translation,
    backend, reading back; the backend gets what is left).

    `backend`: "cpsat" (default), "gurobi", "exhaustive" or "auto". When the
    backend cannot take the model (not installed, over Gurobi's licence size or
    the enumeration limit, unsupported), the error is raised, unless
    `fallback` names another backend: then that one solves and `note` says
    why. "auto" is "gurobi" with fallback "cpsat".

    `hint`: a warm start (CP-SAT solution hint, Gurobi Start; exhaustive
    ignores it). Continuous variables it leaves out are completed when the
    discrete ones determine them.
    """
    started = time.perf_counter()
    if not (time_limit_s > 0 and math.isfinite(time_limit_s)):
        raise ValueError(f"time_limit_s must be a positive finite number, got {time_limit_s}")
    opts = options or SolveOptions()
    if str(backend) == AUTO:
        chosen, fallback = Backend.GUROBI, fallback or Backend.CPSAT
    else:
        chosen = Backend(backend)
    fallback_backend = Backend(fallback) if fallback is not None else None
    deadline = started + time_limit_s
    start_values = _hint_values(model, hint)
    note = ""
    try:
        outcome = _run(chosen, model, deadline, opts, start_values)
    except _FALLBACK_ERRORS as exc:
        if fallback_backend is None or fallback_backend is chosen:
            raise
        note = f"fell back from {chosen} to {fallback_backend}: {exc}"
        chosen = fallback_backend
        outcome = _run(chosen, model, deadline, opts, start_values)
    if outcome.note:
        note = f"{note}; {outcome.note}" if note else outcome.note
    if (
        outcome.values is None
        and outcome.status is Status.TIMEOUT_NO_SOLUTION
        and opts.hint_fallback
        and start_values is not None
        and not np.isnan(start_values).any()
        and model.max_violation(start_values) <= FEASIBILITY_TOL
    ):
        warm = "no solution within the time limit; returning the warm start (feasible)"
        outcome = Outcome(Status.FEASIBLE, start_values, outcome.best_bound)
        note = f"{note}; {warm}" if note else warm
    return _result(model, chosen, outcome, note=note, started=started, time_limit_s=time_limit_s)


def _run(
    backend: Backend,
    model: Model,
    deadline: float,
    options: SolveOptions,
    hint: FloatArray | None,
) -> Outcome:
    remaining = max(deadline - time.perf_counter(), MIN_BACKEND_TIME_S)
    spec = SOLVER_BACKENDS[str(backend)]
    if spec.runner is None:
        raise UnsupportedModelError(spec.not_a_model_solver)
    return spec.runner(model, deadline, remaining, options, hint)


def _hint_values(model: Model, hint: Hint | None) -> FloatArray | None:
    """The warm start as one value per variable (NaN where unknown), with the
    continuous variables completed when the discrete ones determine them."""
    if hint is None:
        return None
    n = model.num_vars
    if isinstance(hint, SolveResult):
        if hint.values is None:
            return None
        values = np.asarray(hint.values, dtype=np.float64).copy()
    elif isinstance(hint, tuple) and len(hint) == 2:
        values = np.full(n, np.nan)
        ids = np.asarray(hint[0], dtype=np.int64).reshape(-1)
        values[ids] = np.asarray(hint[1], dtype=np.float64).reshape(-1)
    else:
        values = np.asarray(hint, dtype=np.float64).reshape(-1).copy()
    if len(values) != n:
        raise ValueError(f"hint has {len(values)} values for {n} variables")
    f = model.frozen()
    unknown = np.isnan(values)
    cont = f.vtype == VarType.CONTINUOUS
    if unknown.any() and not unknown[~cont].any():
        try:
            plan = plan_continuous(f)
        except UnsupportedModelError:
            return values
        discrete = np.where(cont, 0.0, values)
        filled, ok = fill_continuous(f, plan, f.rows.activity(discrete)[None, :])
        if ok[0]:
            values[plan.cont] = filled[0]
    return values


def _result(
    model: Model,
    backend: Backend,
    outcome: Outcome,
    *,
    note: str,
    started: float,
    time_limit_s: float,
) -> SolveResult:
    values = outcome.values
    objective = bound = None
    violation = 0.0
    if values is not None:
        objective = model.objective_value(values)
        violation = model.max_violation(values)
        bound = outcome.best_bound
        if outcome.status is Status.OPTIMAL:
            bound = objective
        elif bound is not None:
            # A bound from the scaled model never lies on the wrong side of the
            # solution it came with.
            bound = max(bound, objective) if model.maximizing else min(bound, objective)
    return SolveResult(
        status=outcome.status,
        backend=backend,
        objective=objective,
        best_bound=bound,
        wall_time_s=time.perf_counter() - started,
        time_limit_s=time_limit_s,
        values=values,
        note=note,
        max_violation=violation,
    )
