"""A model as flat arrays: what the backends read (`Model.frozen()`).

Variable types, row senses, the rows in compressed sparse row form, and the
feasibility check every backend's answer goes through.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import numpy.typing as npt

VarIds = npt.NDArray[np.int64]
"""Variable ids, as `Model.add_*` return them."""

FloatArray = npt.NDArray[np.float64]


class VarType(IntEnum):
    BINARY = 0
    INTEGER = 1
    CONTINUOUS = 2


class Sense(IntEnum):
    """Row sense; `Model` also accepts the strings "<=", ">=", "==" (or "=")."""

    LE = 0
    GE = 1
    EQ = 2


@dataclass(frozen=True)
class Rows:
    """All linear rows in compressed sparse row form (one-hot groups excluded).

    Row i is `sum(coefs[start[i]:start[i+1]] * x[vars[start[i]:start[i+1]]])
    <sense[i]> rhs[i]`.
    """

    start: npt.NDArray[np.int64]
    vars: npt.NDArray[np.int64]
    coefs: FloatArray
    sense: npt.NDArray[np.int8]
    rhs: FloatArray
    entry_row: npt.NDArray[np.int64]
    """The row of every entry of `vars`/`coefs`."""

    @property
    def count(self) -> int:
        return len(self.rhs)

    def activity(self, values: FloatArray) -> FloatArray:
        """Each row's left-hand side at `values` (a full assignment)."""
        terms = self.coefs * values[self.vars]
        return np.asarray(np.bincount(self.entry_row, terms, self.count), dtype=np.float64)


FEASIBILITY_TOL = 1e-6
"""Absolute tolerance, scaled by (1 + |rhs|) per row, for calling an
assignment feasible (exhaustive backend, warm-start checks, max_violation)."""


@dataclass(frozen=True)
class FrozenModel:
    """A model's arrays, as backends read them."""

    lb: FloatArray
    ub: FloatArray
    vtype: npt.NDArray[np.int8]
    resolution: FloatArray
    rows: Rows
    groups: tuple[npt.NDArray[np.int64], ...]
    objective: FloatArray
    """Dense objective coefficients, one per variable (duplicates summed)."""
    objective_constant: float
    maximize: bool

    @property
    def num_vars(self) -> int:
        return len(self.lb)

    def row_violation(self, values: FloatArray) -> FloatArray:
        """Per-row violation (>= 0), relative to (1 + |rhs|)."""
        r = self.rows
        act = r.activity(values)
        over = np.where(r.sense == Sense.GE, r.rhs - act, act - r.rhs)
        over = np.where(r.sense == Sense.EQ, np.abs(act - r.rhs), over)
        return np.maximum(over, 0.0) / (1.0 + np.abs(r.rhs))

    def max_violation(self, values: FloatArray) -> float:
        if len(values) != self.num_vars:
            raise ValueError(f"assignment has {len(values)} values for {self.num_vars} variables")
        worst = 0.0
        if self.num_vars:
            bound = np.maximum(self.lb - values, values - self.ub).max()
            discrete = self.vtype != VarType.CONTINUOUS
            frac = np.abs(values[discrete] - np.round(values[discrete]))
            worst = max(worst, float(bound), float(frac.max()) if frac.size else 0.0)
        if self.rows.count:
            worst = max(worst, float(self.row_violation(values).max()))
        for g in self.groups:
            worst = max(worst, abs(float(values[g].sum()) - 1.0))
        return max(worst, 0.0)
