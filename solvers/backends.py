"""The solver backends by name (``Backend``'s value): what each needs
installed, and the function that solves a ``Model`` with it. ``solve``
dispatches through this registry and ``available_backends`` lists it; a new
backend is one module with its runner plus one entry here."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

from planner.registry import Registry, registry_of

from .cpsat import solve_cpsat
from .exhaustive import solve_exhaustive
from .frozen import FloatArray
from .gurobi import solve_gurobi
from .model import Model
from .options import SolveOptions
from .outcome import Outcome
from .result import Backend

# model, deadline (perf_counter), seconds left (at least the minimum a
# backend is given), options, warm start.
Runner = Callable[[Model, float, float, SolveOptions, FloatArray | None], Outcome]


@dataclass(frozen=True, slots=True)
class BackendSpec:
    backend: Backend
    summary: str
    # The Python package it needs; None: always present.
    requires: str | None = None
    # Solves a Model; None: it takes only an AssignmentProblem, and this
    # says so when solve() is asked for it.
    runner: Runner | None = None
    not_a_model_solver: str = ""

    @property
    def present(self) -> bool:
        return self.requires is None or importlib.util.find_spec(self.requires) is not None


def _cpsat(
    model: Model, deadline: float, left_s: float, options: SolveOptions, hint: FloatArray | None
) -> Outcome:
    return solve_cpsat(model, left_s, options, hint)


def _gurobi(
    model: Model, deadline: float, left_s: float, options: SolveOptions, hint: FloatArray | None
) -> Outcome:
    return solve_gurobi(model, left_s, options, hint)


def _exhaustive(
    model: Model, deadline: float, left_s: float, options: SolveOptions, hint: FloatArray | None
) -> Outcome:
    return solve_exhaustive(model, deadline, options)


SOLVER_BACKENDS: Registry[BackendSpec] = registry_of(
    "solver backend",
    lambda b: str(b.backend),
    (
        BackendSpec(Backend.CPSAT, "OR-Tools CP-SAT (default)", "ortools", _cpsat),
        BackendSpec(
            Backend.GUROBI,
            "Gurobi (the gurobi extra)",
            "gurobipy",
            _gurobi,
        ),
        BackendSpec(
            Backend.EXHAUSTIVE, "exhaustive enumeration, the reference", runner=_exhaustive
        ),
        BackendSpec(
            Backend.BRANCH_AND_BOUND,
            "depth-first branch and bound over one choice per group",
            not_a_model_solver="the branch and bound solves an AssignmentProblem "
            "(branch_and_bound), not a Model",
        ),
    ),
)
