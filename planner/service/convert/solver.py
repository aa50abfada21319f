"""The contract's solver messages: the backend a request names, and a
solve's statistics in an answer."""

from __future__ import annotations

import math
from collections.abc import Collection

from planner.domain import serverless
from planner.service.convert.checks import positive
from planner.service.errors import InvalidArgumentError
from planner.solvers import Backend, SolveStats, Status
from planner.v1 import common_pb2, solver_pb2

# The contract's name of each backend.
PROTO_BACKENDS: dict[Backend, common_pb2.SolverBackend.ValueType] = {
    Backend.BRANCH_AND_BOUND: common_pb2.SOLVER_BACKEND_BRANCH_AND_BOUND,
    Backend.CPSAT: common_pb2.SOLVER_BACKEND_CP_SAT,
    Backend.GUROBI: common_pb2.SOLVER_BACKEND_GUROBI,
    Backend.EXHAUSTIVE: common_pb2.SOLVER_BACKEND_EXHAUSTIVE,
}
_BACKEND_OF = {value: backend for backend, value in PROTO_BACKENDS.items()}
_PROTO_OF_NAME = {backend.value: value for backend, value in PROTO_BACKENDS.items()}
# The backends that solve a Model (planner.solvers), for the policies that
# build one.
MODEL_SOLVERS = (Backend.CPSAT, Backend.GUROBI, Backend.EXHAUSTIVE)

_STATUS: dict[str, solver_pb2.SolveStatus.ValueType] = {
    Status.OPTIMAL.value: solver_pb2.SOLVE_STATUS_OPTIMAL,
    Status.FEASIBLE.value: solver_pb2.SOLVE_STATUS_FEASIBLE,
    Status.INFEASIBLE.value: solver_pb2.SOLVE_STATUS_INFEASIBLE,
    Status.TIMEOUT_NO_SOLUTION.value: solver_pb2.SOLVE_STATUS_TIMEOUT_NO_SOLUTION,
}


def backend_from_proto(
    field: str,
    value: common_pb2.SolverBackend.ValueType,
    accepted: Collection[Backend],
    default: Backend,
) -> Backend:
    """The backend a request names (default for UNSPECIFIED); a value that
    is not one of accepted is refused, naming field."""
    if value == common_pb2.SOLVER_BACKEND_UNSPECIFIED:
        return default
    backend = _BACKEND_OF.get(value)
    if backend is None or backend not in accepted:
        names = ", ".join(common_pb2.SolverBackend.Name(PROTO_BACKENDS[b]) for b in accepted)
        raise InvalidArgumentError(field, f"{value} is not a backend of this call ({names})")
    return backend


def model_solver_from_proto(field: str, value: common_pb2.SolverBackend.ValueType) -> Backend:
    """The Model solver a request names; CP-SAT when it names none."""
    return backend_from_proto(field, value, MODEL_SOLVERS, Backend.CPSAT)


def time_limit_from_proto(
    solver: solver_pb2.SolverOptions,
    default_s: float,
    time_remaining_s: float | None,
    margin_s: float,
    floor_s: float = 1e-4,
) -> float:
    """The solve's time limit: the request's solver.time_limit_s (> 0) or
    default_s, cut to the call's remaining time less margin_s (the time
    left to answer), never below floor_s."""
    limit = (
        positive("solver.time_limit_s", solver.time_limit_s)
        if solver.HasField("time_limit_s")
        else default_s
    )
    if time_remaining_s is not None:
        limit = min(limit, max(time_remaining_s - margin_s, floor_s))
    return limit


def relative_gap_from_proto(solver: solver_pb2.SolverOptions) -> float:
    """The request's solver.relative_gap, in [0, 1); 0 when unset."""
    if not solver.HasField("relative_gap"):
        return 0.0
    gap = solver.relative_gap
    if not 0.0 <= gap < 1.0:
        raise InvalidArgumentError("solver.relative_gap", f"must be in [0, 1), got {gap}")
    return gap


def solve_stats_to_proto(
    *,
    backend: str,
    status: str,
    objective: float | None,
    best_bound: float | None,
    gap: float | None,
    wall_s: float,
    time_limit_s: float,
    note: str,
) -> solver_pb2.SolveStats:
    """A solve's statistics (absent numbers and an infinite gap as 0; a
    status the contract does not name, such as MODEL_INVALID, as ERROR)."""
    return solver_pb2.SolveStats(
        backend=_PROTO_OF_NAME.get(backend, common_pb2.SOLVER_BACKEND_UNSPECIFIED),
        status=_STATUS.get(status, solver_pb2.SOLVE_STATUS_ERROR),
        objective=objective or 0.0,
        best_bound=best_bound or 0.0,
        gap=gap if gap is not None and math.isfinite(gap) else 0.0,
        wall_s=wall_s,
        time_limit_s=time_limit_s,
        note=note,
    )


def plan_solve_to_proto(solve: SolveStats | serverless.SolveStats) -> solver_pb2.SolveStats:
    """The statistics of the solve behind a plan, as solve_stats_to_proto
    writes them."""
    return solve_stats_to_proto(
        backend=solve.backend,
        status=solve.status,
        objective=solve.objective,
        best_bound=solve.best_bound,
        gap=solve.gap,
        wall_s=solve.wall_s,
        time_limit_s=solve.time_limit_s,
        note=solve.note,
    )
