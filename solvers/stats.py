"""SolveStats: what one solve reports to a policy's plan, whichever backend
ran it (a `Model` backend through `solve`, or `branch_and_bound`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .result import Backend, SolveResult, Status


@dataclass(frozen=True, slots=True)
class SolveStats:
    """One solve: objective and best bound in the formulation's units (the
    policy says which; seconds of step latency for layer offload), the time
    and work it used against its limits."""

    backend: Backend
    status: Status
    objective: float | None
    best_bound: float | None
    wall_s: float
    time_limit_s: float
    nodes: int = 0
    """Work done: nodes the branch and bound evaluated (0 for other backends)."""
    node_limit: int | None = None
    """The work limit the solve ran under; None when only the clock bounded it."""
    note: str = ""

    @property
    def gap(self) -> float | None:
        """(objective - best_bound) / |objective| for a minimisation (0 when
        the bound meets the objective); None without both."""
        if self.objective is None or self.best_bound is None:
            return None
        if not (math.isfinite(self.objective) and math.isfinite(self.best_bound)):
            return None
        diff = self.objective - self.best_bound
        if diff <= 1e-12 * max(1.0, abs(self.objective)):
            return 0.0
        return diff / abs(self.objective) if self.objective != 0 else math.inf

    @property
    def has_solution(self) -> bool:
        return self.objective is not None

    @classmethod
    def of_result(cls, result: SolveResult) -> SolveStats:
        return cls(
            backend=result.backend,
            status=result.status,
            objective=result.objective,
            best_bound=result.best_bound,
            wall_s=result.wall_time_s,
            time_limit_s=result.time_limit_s,
            note=result.note,
        )
