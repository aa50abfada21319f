"""Backend-agnostic formulations and solver backends (`planner.solvers`).

Write a model once (`Model`), solve it with CP-SAT (default), Gurobi or
exhaustive enumeration (`solve`); every solve has a time limit and returns a
`SolveResult`. Problems of one choice per group that bring their own bounds
and exact objective use the branch and bound (`branch_and_bound`, a time and
a node limit). `SolveStats` is what either reports to a policy's plan.
solvers/README.md has the details and the measurements.
"""

from .assignment_search import (
    AssignmentProblem,
    Children,
    Incumbent,
    SearchOutcome,
    branch_and_bound,
)
from .backends import SOLVER_BACKENDS, BackendSpec
from .errors import (
    BackendUnavailableError,
    ModelTooLargeError,
    SolverError,
    UnsupportedModelError,
)
from .exhaustive import enumeration_size
from .frozen import FEASIBILITY_TOL, FrozenModel, Sense, VarIds, VarType
from .instances import one_hot_envelope_model
from .model import Model
from .options import SolveOptions
from .result import Backend, SolveResult, Status
from .solve import AUTO, Hint, available_backends, solve
from .stats import SolveStats

__all__ = [
    "AUTO",
    "FEASIBILITY_TOL",
    "SOLVER_BACKENDS",
    "AssignmentProblem",
    "Backend",
    "BackendSpec",
    "BackendUnavailableError",
    "Children",
    "FrozenModel",
    "Hint",
    "Incumbent",
    "Model",
    "ModelTooLargeError",
    "SearchOutcome",
    "Sense",
    "SolveOptions",
    "SolveResult",
    "SolveStats",
    "SolverError",
    "Status",
    "UnsupportedModelError",
    "VarIds",
    "VarType",
    "available_backends",
    "branch_and_bound",
    "enumeration_size",
    "one_hot_envelope_model",
    "solve",
]
