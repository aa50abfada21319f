"""What every solve returns: status, objective, bound, gap, time, backend, values."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import numpy.typing as npt


class Status(StrEnum):
    OPTIMAL = "OPTIMAL"
    """Proved optimal (within the backend's gap limit, 0 by default)."""
    FEASIBLE = "FEASIBLE"
    """A solution, not proved optimal (time limit reached)."""
    INFEASIBLE = "INFEASIBLE"
    """Proved to have no solution."""
    TIMEOUT_NO_SOLUTION = "TIMEOUT_NO_SOLUTION"
    """The time limit passed before any solution was found."""
    MODEL_INVALID = "MODEL_INVALID"
    """The backend rejected the model (e.g. CP-SAT integer overflow); see `note`."""
    ERROR = "ERROR"
    """The backend stopped for another reason (numerical trouble); see `note`."""


class Backend(StrEnum):
    CPSAT = "cpsat"
    GUROBI = "gurobi"
    EXHAUSTIVE = "exhaustive"
    BRANCH_AND_BOUND = "bnb"
    """Depth-first branch and bound over one choice per group
    (`branch_and_bound`); a problem supplies its own bounds and exact
    objective, so it takes an `AssignmentProblem`, not a `Model`."""


@dataclass(frozen=True)
class SolveResult:
    status: Status
    backend: Backend
    """The backend that produced this result (after any fallback)."""
    objective: float | None
    """The model's objective at `values`, in the model's own units (computed
    from the unscaled coefficients); None without a solution."""
    best_bound: float | None
    """The best proven bound on the optimum (equal to `objective` when
    OPTIMAL); None when the backend proved none."""
    wall_time_s: float
    """The whole `solve` call: translation, backend, reading the solution."""
    time_limit_s: float
    values: npt.NDArray[np.float64] | None
    """One value per variable id; None without a solution."""
    note: str = ""
    """Why a fallback happened, or what else the caller should know; "" if nothing."""
    max_violation: float = 0.0
    """The solution's largest bound/row/group violation in the model's units,
    relative to (1 + |rhs|) for rows (CP-SAT's rounding can leave a little)."""

    @property
    def has_solution(self) -> bool:
        return self.values is not None

    @property
    def gap(self) -> float | None:
        """|objective - best_bound| / |objective| (0 when equal, inf when the
        objective is 0 and the bound is not); None without both."""
        if self.objective is None or self.best_bound is None:
            return None
        diff = abs(self.objective - self.best_bound)
        if diff <= 1e-12 * max(1.0, abs(self.objective)):
            return 0.0
        return diff / abs(self.objective) if self.objective != 0 else math.inf

    def value(self, vars: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """The solution's values of these variable ids (same shape)."""
        if self.values is None:
            raise ValueError(f"no solution ({self.status})")
        out: npt.NDArray[np.float64] = self.values[np.asarray(vars, dtype=np.int64)]
        return out
