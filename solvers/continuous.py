"""Continuous variables that the discrete ones determine.

When no row holds two continuous variables, fixing the discrete variables
leaves each continuous variable y an interval [lo, hi] (its bounds cut by the
rows it is in), independent of the others, and the objective is best at one
end: lo when its coefficient (as minimized) is >= 0, else hi. This is how the
exhaustive backend handles continuous variables (stall_l >= fetch_l @ x - c_l,
stall_l >= 0 among them), and how a warm start that gives only the discrete
variables is completed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .errors import UnsupportedModelError
from .frozen import FEASIBILITY_TOL, FloatArray, FrozenModel, Sense, VarType

BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class ContinuousPlan:
    cont: npt.NDArray[np.int64]
    """The continuous variables."""
    rows: npt.NDArray[np.int64]
    """Rows holding a continuous variable (one each)."""
    row_var: npt.NDArray[np.int64]
    """Per such row: the position in `cont` of its continuous variable."""
    row_coef: FloatArray
    prefer_low: BoolArray
    """Per continuous variable: the objective prefers it low."""


def plan_continuous(f: FrozenModel) -> ContinuousPlan:
    """Raises UnsupportedModelError when a row holds two continuous variables."""
    r = f.rows
    is_cont = f.vtype == VarType.CONTINUOUS
    cont = np.flatnonzero(is_cont).astype(np.int64)
    position = np.full(f.num_vars, -1, np.int64)
    position[cont] = np.arange(len(cont))
    entry_cont = is_cont[r.vars] & (r.coefs != 0)
    per_row = np.bincount(r.entry_row[entry_cont], minlength=r.count)
    if (per_row > 1).any():
        row = int(np.flatnonzero(per_row > 1)[0])
        raise UnsupportedModelError(
            f"row {row} holds {per_row[row]} continuous variables; continuous variables are "
            "supported here only when no row holds two of them (then the discrete "
            "variables determine them)"
        )
    entries = np.flatnonzero(entry_cont)
    sign = -1.0 if f.maximize else 1.0
    return ContinuousPlan(
        cont=cont,
        rows=r.entry_row[entries],
        row_var=position[r.vars[entries]],
        row_coef=r.coefs[entries],
        prefer_low=sign * f.objective[cont] >= 0,
    )


def fill_continuous(
    f: FrozenModel, plan: ContinuousPlan, activity: FloatArray
) -> tuple[FloatArray, BoolArray]:
    """Best continuous values for a batch of discrete assignments.

    `activity` is (batch, rows): each row's left side over the discrete
    variables only. Returns (batch, len(plan.cont)) values and a per-assignment
    flag: every continuous interval is non-empty."""
    batch = activity.shape[0]
    k = len(plan.cont)
    lo = np.broadcast_to(f.lb[plan.cont], (batch, k)).copy()
    hi = np.broadcast_to(f.ub[plan.cont], (batch, k)).copy()
    if len(plan.rows):
        r = f.rows
        sense = r.sense[plan.rows]
        rhs = r.rhs[plan.rows]
        a = plan.row_coef
        # a * y <sense> rhs - rest   =>   y <sense'> (rhs - rest) / a
        bound = (rhs[None, :] - activity[:, plan.rows]) / a[None, :]
        gives_upper = ((sense == Sense.LE) & (a > 0)) | ((sense == Sense.GE) & (a < 0))
        gives_lower = ((sense == Sense.GE) & (a > 0)) | ((sense == Sense.LE) & (a < 0))
        eq = sense == Sense.EQ
        upper_cols = np.flatnonzero(gives_upper | eq)
        lower_cols = np.flatnonzero(gives_lower | eq)
        # Reduce each row's bound onto its variable's column (transposed views).
        if len(upper_cols):
            np.minimum.at(hi.T, plan.row_var[upper_cols], bound[:, upper_cols].T)
        if len(lower_cols):
            np.maximum.at(lo.T, plan.row_var[lower_cols], bound[:, lower_cols].T)
    ok: BoolArray = np.all(lo <= hi + FEASIBILITY_TOL * (1.0 + np.abs(hi)), axis=1)
    values = np.where(plan.prefer_low[None, :], np.minimum(lo, hi), np.maximum(lo, hi))
    return values, ok
