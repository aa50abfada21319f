"""Whether the Gurobi backend runs here, for the solver benchmarks to skip it
with the reason when it does not."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from planner.solvers import Backend, Model, SolverError, solve


def gurobi_unavailable() -> str | None:
    """Why Gurobi cannot run here, or None when a tiny model solves."""
    m = Model()
    x = m.add_binaries(2)
    m.add_exactly_one_groups(x.reshape(1, 2))
    m.minimize(x, 1.0)
    try:
        solve(m, time_limit_s=1.0, backend=Backend.GUROBI)
    except SolverError as exc:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None


def runnable_backends(
    backends: Sequence[str], skipped: dict[str, str], progress: Callable[[str], None]
) -> list[str]:
    """backends less "gurobi" when it cannot run here (the reason recorded
    in skipped and reported through progress)."""
    out = list(backends)
    if "gurobi" in out:
        why = gurobi_unavailable()
        if why is not None:
            skipped["gurobi"] = why
            out.remove("gurobi")
            progress(f"gurobi skipped: {why}")
    return out
