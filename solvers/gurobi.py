"""Gurobi backend (optional: `pip install 'planner[gurobi]'`).

The pip wheel carries a size-limited licence (2000 variables, 2000 linear
constraints); over it Gurobi raises error 10010, which becomes
ModelTooLargeError (or, when the caller asked for a fallback, a CP-SAT solve
that says so in its note). One Gurobi environment is opened on first use and
kept for the process (opening one checks the licence and costs milliseconds).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .errors import BackendUnavailableError, ModelTooLargeError
from .frozen import FloatArray, Sense, VarType
from .model import Model
from .options import SolveOptions
from .outcome import Outcome
from .result import Status

INSTALL_HINT = "pip install 'planner[gurobi]'"
SIZE_LIMIT_ERROR = 10010
"""GRB_ERROR_SIZE_LIMIT_EXCEEDED: the model is over the licence's size limit."""

_env_lock = threading.Lock()
_env: dict[str, Any] = {}
"""The process's Gurobi environment, under "env" once opened."""


def import_gurobipy() -> Any:
    """gurobipy, or BackendUnavailableError naming the extra to install."""
    try:
        import gurobipy  # noqa: PLC0415 - gurobipy is optional (the gurobi extra)
    except ImportError as exc:
        raise BackendUnavailableError(
            f"gurobi backend: gurobipy is not installed ({INSTALL_HINT})"
        ) from exc
    return gurobipy


def _environment(gp: Any) -> Any:
    with _env_lock:
        if "env" not in _env:
            try:
                _env["env"] = gp.Env(params={"OutputFlag": 0})
            except gp.GurobiError as exc:
                raise BackendUnavailableError(f"gurobi backend: no usable licence: {exc}") from exc
        return _env["env"]


_VTYPE = {int(VarType.BINARY): "B", int(VarType.INTEGER): "I", int(VarType.CONTINUOUS): "C"}
_SENSE = {int(Sense.LE): "<", int(Sense.GE): ">", int(Sense.EQ): "="}


def solve_gurobi(
    model: Model, time_limit_s: float, options: SolveOptions, hint: FloatArray | None
) -> Outcome:
    gp = import_gurobipy()
    env = _environment(gp)
    f = model.frozen()
    m = gp.Model(model.name or "planner", env=env)
    try:
        p = m.Params
        p.OutputFlag = 1 if options.log else 0
        p.TimeLimit = max(time_limit_s, 0.0)
        p.Threads = options.threads
        if options.work_limit is not None:
            p.WorkLimit = options.work_limit
        p.MIPGap = options.relative_gap
        p.Seed = options.seed
        vtypes = [_VTYPE[int(v)] for v in f.vtype]
        x = m.addVars(f.num_vars, lb=f.lb.tolist(), ub=f.ub.tolist(), vtype=vtypes)
        xs = [x[i] for i in range(f.num_vars)]
        for g in f.groups:
            m.addLConstr(gp.LinExpr([1.0] * len(g), [xs[j] for j in g.tolist()]), "=", 1.0)
        r = f.rows
        vars_all, coefs_all, starts = r.vars.tolist(), r.coefs.tolist(), r.start.tolist()
        for i, (sense, rhs) in enumerate(zip(r.sense.tolist(), r.rhs.tolist(), strict=True)):
            a, b = starts[i], starts[i + 1]
            expr = gp.LinExpr(coefs_all[a:b], [xs[j] for j in vars_all[a:b]])
            m.addLConstr(expr, _SENSE[sense], rhs)
        nz = np.flatnonzero(f.objective).tolist()
        objective = gp.LinExpr([float(f.objective[j]) for j in nz], [xs[j] for j in nz])
        objective.addConstant(f.objective_constant)
        m.setObjective(objective, gp.GRB.MAXIMIZE if f.maximize else gp.GRB.MINIMIZE)
        if hint is not None:
            for j in np.flatnonzero(~np.isnan(hint)).tolist():
                xs[j].Start = float(hint[j])
        try:
            m.optimize()
        except gp.GurobiError as exc:
            if exc.errno == SIZE_LIMIT_ERROR:
                raise ModelTooLargeError(
                    f"gurobi: model over the licence's size limit ({f.num_vars} variables, "
                    f"{model.num_constraints} constraints; the pip licence allows 2000 each): "
                    f"{exc}"
                ) from exc
            raise
        return _outcome(gp, m, xs)
    finally:
        m.dispose()


def _outcome(gp: Any, m: Any, xs: list[Any]) -> Outcome:
    code = m.Status
    grb = gp.GRB
    has_solution = m.SolCount > 0
    values = np.array(m.getAttr("X", xs), dtype=np.float64) if has_solution else None
    bound = _bound(m) if has_solution else None
    if code == grb.OPTIMAL:
        return Outcome(Status.OPTIMAL, values, bound)
    if code in (grb.INFEASIBLE, grb.INF_OR_UNBD):
        # Every variable is bounded, so INF_OR_UNBD means infeasible.
        return Outcome(Status.INFEASIBLE)
    if code == grb.TIME_LIMIT:
        return Outcome(
            Status.FEASIBLE if has_solution else Status.TIMEOUT_NO_SOLUTION, values, bound
        )
    note = f"gurobi: stopped with status code {code}"
    if has_solution:
        return Outcome(Status.FEASIBLE, values, bound, note)
    return Outcome(Status.ERROR, note=note)


def _bound(m: Any) -> float | None:
    if m.IsMIP:
        return float(m.ObjBound)
    return float(m.ObjVal) if m.Status == 2 else None  # an LP's optimum is its bound
