"""Backend-agnostic formulations and solver backends (`planner.solvers`).

Write a model once (`Model`), solve it with CP-SAT (default), Gurobi or
exhaustive enumeration (`solve`); every solve has a time limit and returns a
`SolveResult`. solvers/README.md has the details and the measurements.
"""

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

__all__ = [
    "AUTO",
    "FEASIBILITY_TOL",
    "Backend",
    "BackendUnavailableError",
    "FrozenModel",
    "Hint",
    "Model",
    "ModelTooLargeError",
    "Sense",
    "SolveOptions",
    "SolveResult",
    "SolverError",
    "Status",
    "UnsupportedModelError",
    "VarIds",
    "VarType",
    "available_backends",
    "enumeration_size",
    "one_hot_envelope_model",
    "solve",
]
