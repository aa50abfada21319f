"""Why a backend could not take a model (raised only when no fallback was asked for)."""

from __future__ import annotations


class SolverError(Exception):
    """Base of the errors `planner.solvers` raises."""


class BackendUnavailableError(SolverError):
    """The backend's package is not installed, or has no usable licence."""


class ModelTooLargeError(SolverError):
    """The model is over a backend's limits: Gurobi's size-limited pip licence
    (2000 variables / 2000 constraints), or the exhaustive enumeration limit."""


class UnsupportedModelError(SolverError):
    """The backend cannot represent the model (e.g. exhaustive enumeration of a
    continuous variable that the discrete ones do not determine)."""
