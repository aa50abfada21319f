"""The placer's least max |eq| as a configuration (pattern) model.

Models of one class (same shard count, same role) are interchangeable for
GPU capacity and for eq_s, so a server is described by its configuration:
how many models of each class it holds. For a cap e, the configurations
that fit the GPUs and have |eq| <= e are enumerated, and an integer program
asks for S of them (y_c servers use configuration c) that hold every model
of every class. Without server symmetry and with a strong LP relaxation,
CP-SAT answers it (feasible or proved infeasible) in milliseconds where the
servers x classes count model (placer_counts.py) can run for seconds at 16
servers. The least feasible e, from a proved lower bound up, is the optimum
E* of max_s |eq_s| over all placements: a valid lower bound on E."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from planner.domain.placement import PlacementInputs
from planner.policies.aqua.placer_counts import EqCounts
from planner.solvers import Backend, Model, SolveOptions, Status, solve

MB = 10**6
# Above this many configurations the enumeration is abandoned (the caller
# falls back to the count model).
MAX_CONFIGURATIONS = 50_000
# CP-SAT presolve off: faster on these small feasibility models (measured).
PRESOLVE = False


def _sign(r: int) -> int:
    return (r > 0) - (r < 0)


def model_classes(inputs: PlacementInputs) -> dict[tuple[int, int], int]:
    """(shards, sign of R) -> how many models of that class."""
    members: dict[tuple[int, int], int] = {}
    for m in inputs.models:
        key = (m.shards, _sign(round(m.r_bytes / MB)))
        members[key] = members.get(key, 0) + 1
    return members


def _configurations(
    sizes: list[int], limits: list[int], capacity: int
) -> Iterator[tuple[int, ...]]:
    if not sizes:
        yield ()
        return
    for n in range(min(limits[0], capacity // sizes[0]) + 1):
        for rest in _configurations(sizes[1:], limits[1:], capacity - n * sizes[0]):
            yield (n, *rest)


def min_eq_patterns(
    inputs: PlacementInputs, e_low: int, e_high: int, deadline: float
) -> EqCounts | None:
    """The least e in [e_low, e_high] for which the configuration model is
    feasible, with its counts (proved: every smaller e down to e_low was
    proved infeasible). e_low must be a valid lower bound on E. None when
    time runs out before an answer, the enumeration is too large, or no e up
    to e_high is feasible."""
    members = model_classes(inputs)
    classes = tuple(sorted(members))
    sizes = [c[0] for c in classes]
    limits = [members[c] for c in classes]
    w = np.array([c[0] * c[1] for c in classes], dtype=np.int64)
    configs: list[tuple[int, ...]] = []
    for c in _configurations(sizes, limits, inputs.gpus_per_server):
        configs.append(c)
        if len(configs) > MAX_CONFIGURATIONS:
            return None
    table = np.array(configs, dtype=np.int64).reshape(len(configs), len(classes))
    eqs = table @ w
    s_count = inputs.num_servers
    for e in range(e_low, e_high + 1):
        left = deadline - time.perf_counter()
        if left <= 0:
            return None
        keep = np.flatnonzero(np.abs(eqs) <= e)
        if keep.size == 0:
            continue
        model = Model("aqua-placer-eq-patterns")
        y = model.add_integers(keep.size, 0, s_count)
        model.add_linear(y, 1.0, "==", float(s_count))
        for k, c in enumerate(classes):
            col = table[keep, k].astype(np.float64)
            nz = col != 0
            model.add_linear(y[nz], col[nz], "==", float(members[c]))
        model.minimize(y[:1], [0.0])
        result = solve(
            model, time_limit_s=left, backend=Backend.CPSAT, options=SolveOptions(presolve=PRESOLVE)
        )
        if result.status is Status.INFEASIBLE:
            continue
        if not result.has_solution:
            return None
        uses = np.rint(result.value(y)).astype(np.int64)
        rows = [
            table[keep[j]] for j in np.argsort(-eqs[keep], kind="stable") for _ in range(uses[j])
        ]
        counts = np.array(rows, dtype=np.int64).reshape(s_count, len(classes))
        return EqCounts(int(np.abs(counts @ w).max(initial=0)), True, counts, classes)
    return None
