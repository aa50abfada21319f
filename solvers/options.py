"""Knobs shared by the backends (each reads the ones that apply to it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SolveOptions:
    threads: int = 1
    """CP-SAT `num_workers` / Gurobi `Threads`; 0 = the backend's default (all
    cores). 1 is fastest for the small models policies solve on a few cores
    (solvers/README.md has the measurements)."""
    relative_gap: float = 0.0
    """Stop once |objective - bound| <= relative_gap * |objective|."""
    seed: int = 0
    coefficient_bits: int = 20
    """CP-SAT: a row or objective whose coefficients are not integers after
    scaling by a power of two of at most this many bits is rounded so that its
    largest coefficient has `coefficient_bits` bits (relative resolution
    2**-coefficient_bits); see solvers/README.md, "Scaling"."""
    work_limit: float | None = None
    """A deterministic work limit next to the time limit (None: the clock
    only): CP-SAT `max_deterministic_time` (its deterministic seconds), Gurobi
    `WorkLimit` (its work units, about a second of one core each); with one
    thread the same model stops at the same point on any machine. Exhaustive
    enumeration is bounded by `max_enumeration` instead."""
    presolve: bool = True
    """CP-SAT presolve (off can find a first solution sooner on tiny budgets)."""
    max_enumeration: int = 2_000_000
    """Exhaustive: refuse (ModelTooLargeError) above this many assignments."""
    log: bool = False
    """Let the backend print its search log."""
    hint_fallback: bool = True
    """When a backend returns no solution in time but the warm start is
    feasible, return the warm start (status FEASIBLE, said in `note`)."""

    def __post_init__(self) -> None:
        if self.threads < 0:
            raise ValueError("threads must be >= 0")
        if not self.relative_gap >= 0.0:
            raise ValueError("relative_gap must be >= 0")
        if not 4 <= self.coefficient_bits <= 52:
            raise ValueError("coefficient_bits must be in [4, 52]")
        if self.work_limit is not None and not self.work_limit > 0.0:
            raise ValueError("work_limit must be > 0 (or None)")
        if self.max_enumeration < 1:
            raise ValueError("max_enumeration must be >= 1")
