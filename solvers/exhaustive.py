"""Exhaustive enumeration: the reference answer for small models.

Enumerates every assignment of the discrete variables: one dimension per
disjoint exactly-one group (its size, not 2**size) and one per other
binary/integer variable (its range). Continuous variables are set to their
best value given the discrete ones (continuous.py), which needs no row to hold
two of them. Rows are evaluated in batches through per-dimension contribution
tables, so a million assignments take about a second. Refuses
(ModelTooLargeError) above `SolveOptions.max_enumeration` assignments; ignores
warm starts. Ties go to the first assignment in enumeration order.
"""

from __future__ import annotations

import math
import time

import numpy as np
import numpy.typing as npt

from .continuous import fill_continuous, plan_continuous
from .errors import ModelTooLargeError
from .frozen import FEASIBILITY_TOL, FloatArray, FrozenModel, Sense, VarType
from .model import Model
from .options import SolveOptions
from .outcome import Outcome
from .result import Status

_BATCH_CELLS = 1 << 21
"""Assignments per batch times rows: bounds a batch's memory (16 MiB)."""


def _dimensions(f: FrozenModel) -> tuple[list[npt.NDArray[np.int64]], list[int], list[int]]:
    """Disjoint groups (chosen greedily, in order) and the other discrete
    variables; returns (groups, loose variable ids, indices of groups left to
    check as constraints)."""
    taken = np.zeros(f.num_vars, bool)
    groups: list[npt.NDArray[np.int64]] = []
    leftover: list[int] = []
    for i, g in enumerate(f.groups):
        if taken[g].any():
            leftover.append(i)
            continue
        taken[g] = True
        groups.append(g)
    loose = [int(j) for j in np.flatnonzero(~taken & (f.vtype != VarType.CONTINUOUS))]
    return groups, loose, leftover


def enumeration_size(model: Model) -> int:
    """How many assignments the exhaustive backend would enumerate."""
    f = model.frozen()
    groups, loose, _ = _dimensions(f)
    sizes = [len(g) for g in groups] + [int(f.ub[j] - f.lb[j]) + 1 for j in loose]
    return math.prod(sizes)


def solve_exhaustive(model: Model, deadline: float, options: SolveOptions) -> Outcome:
    f = model.frozen()
    plan = plan_continuous(f)
    groups, loose, leftover = _dimensions(f)
    total = enumeration_size(model)
    if total > options.max_enumeration:
        raise ModelTooLargeError(
            f"exhaustive: {total:.3g} assignments to enumerate, over the limit of "
            f"{options.max_enumeration:,} (SolveOptions.max_enumeration); use cpsat"
        )
    r = f.rows
    discrete = f.vtype != VarType.CONTINUOUS
    # Dense row matrix over discrete columns (continuous ones are filled later).
    a = np.zeros((r.count, f.num_vars))
    keep = discrete[r.vars]
    np.add.at(a, (r.entry_row[keep], r.vars[keep]), r.coefs[keep])
    obj = np.where(discrete, f.objective, 0.0)
    # Per dimension: choice -> (row contributions, objective, assignment)
    tables: list[tuple[FloatArray, FloatArray]] = []
    for g in groups:
        tables.append((a[:, g].T.copy(), obj[g].copy()))
    for j in loose:
        vals = np.arange(f.lb[j], f.ub[j] + 1)
        tables.append((np.outer(vals, a[:, j]), vals * obj[j]))
    sizes = [len(t[1]) for t in tables]
    # Fixed part: every discrete variable at 0 except through its dimension.
    plain_rows = np.ones(r.count, bool)
    plain_rows[plan.rows] = False
    sense, rhs = r.sense[plain_rows], r.rhs[plain_rows]
    tol = FEASIBILITY_TOL * (1.0 + np.abs(rhs))
    sign = -1.0 if f.maximize else 1.0
    cont_obj = f.objective[plan.cont]
    left_groups = [f.groups[i] for i in leftover]

    batch = max(1, _BATCH_CELLS // max(1, r.count + len(plan.cont)))
    best_index = -1
    best_key = math.inf
    best_cont: FloatArray | None = None
    timed_out = False
    for start in range(0, total, batch):
        if start and time.perf_counter() > deadline:
            timed_out = True
            break
        idx = np.arange(start, min(total, start + batch), dtype=np.int64)
        digits = _digits(idx, sizes)
        act = np.zeros((len(idx), r.count))
        value = np.zeros(len(idx))
        for (rows_tab, obj_tab), d in zip(tables, digits, strict=True):
            act += rows_tab[d]
            value += obj_tab[d]
        ok = _rows_ok(act[:, plain_rows], sense, rhs, tol)
        if left_groups:
            ok &= _groups_ok(digits, groups, loose, left_groups, f)
        cont_vals, cont_ok = fill_continuous(f, plan, act)
        ok &= cont_ok
        value += cont_vals @ cont_obj
        key = np.where(ok, sign * value, math.inf)
        i = int(np.argmin(key))
        if key[i] < best_key:
            best_key, best_index, best_cont = float(key[i]), int(idx[i]), cont_vals[i]
    if best_index < 0:
        return Outcome(Status.TIMEOUT_NO_SOLUTION if timed_out else Status.INFEASIBLE)
    values = _assignment(best_index, sizes, groups, loose, f)
    assert best_cont is not None
    values[plan.cont] = best_cont
    if timed_out:
        note = f"exhaustive: time limit after {start:,} of {total:,} assignments"
        return Outcome(Status.FEASIBLE, values, None, note)
    return Outcome(Status.OPTIMAL, values, model.objective_value(values))


def _digits(idx: npt.NDArray[np.int64], sizes: list[int]) -> list[npt.NDArray[np.int64]]:
    """Mixed-radix digits of each index, the last dimension fastest."""
    out: list[npt.NDArray[np.int64]] = []
    rest = idx.copy()
    for size in reversed(sizes):
        out.append(rest % size)
        rest //= size
    out.reverse()
    return out


def _rows_ok(
    act: FloatArray, sense: npt.NDArray[np.int8], rhs: FloatArray, tol: FloatArray
) -> npt.NDArray[np.bool_]:
    le = (sense == Sense.LE) | (sense == Sense.EQ)
    ge = (sense == Sense.GE) | (sense == Sense.EQ)
    ok: npt.NDArray[np.bool_] = (((act <= rhs + tol) | ~le) & ((act >= rhs - tol) | ~ge)).all(
        axis=1
    )
    return ok


def _groups_ok(
    digits: list[npt.NDArray[np.int64]],
    groups: list[npt.NDArray[np.int64]],
    loose: list[int],
    left_groups: list[npt.NDArray[np.int64]],
    f: FrozenModel,
) -> npt.NDArray[np.bool_]:
    """Overlapping groups, checked on the assignment itself."""
    x = np.zeros((len(digits[0]), f.num_vars))
    rows = np.arange(len(digits[0]))
    for g, d in zip(groups, digits, strict=False):
        x[rows, g[d]] = 1.0
    for j, d in zip(loose, digits[len(groups) :], strict=True):
        x[:, j] = f.lb[j] + d
    ok = np.ones(len(rows), bool)
    for g in left_groups:
        ok &= np.abs(x[:, g].sum(axis=1) - 1.0) <= FEASIBILITY_TOL
    return ok


def _assignment(
    index: int,
    sizes: list[int],
    groups: list[npt.NDArray[np.int64]],
    loose: list[int],
    f: FrozenModel,
) -> FloatArray:
    digits = [int(d[0]) for d in _digits(np.array([index], np.int64), sizes)]
    values = np.zeros(f.num_vars)
    for g, d in zip(groups, digits, strict=False):
        values[g[d]] = 1.0
    for j, d in zip(loose, digits[len(groups) :], strict=True):
        values[j] = f.lb[j] + d
    return values
