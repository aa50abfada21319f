"""The placer's eq phase on aggregated counts (a decomposition of
placer.py's model): identical models (same shard count and role) are
interchangeable for capacity and for eq_s, so how many of each class go on
each server decides max_s |eq_s|. That model has classes x servers integer
variables (6 x 128 at 1,024 GPUs, against 500 x 128 binaries) and CP-SAT
usually proves its optimum E* in milliseconds; E* is a valid lower bound on
the full model's E, and the counts give a placement with max |eq| = E* once
the models of each class are dealt to the servers' slots (memory balanced
greedily, largest |R| first)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.domain.placement import PlacementInputs
from planner.solvers import Backend, Model, SolveOptions, Status, solve

MB = 10**6


def _sign(r: int) -> int:
    return (r > 0) - (r < 0)


@dataclass(frozen=True)
class EqCounts:
    e: int  # max_s |eq_s| of the counts
    proved: bool  # e is the optimum (a lower bound on any placement's E)
    # servers x classes counts, classes as (shards, sign) in `classes`
    counts: np.ndarray
    classes: tuple[tuple[int, int], ...]


def min_eq_counts(
    inputs: PlacementInputs,
    e_low: int,
    time_limit_s: float,
    start: list[int] | None = None,
) -> EqCounts | None:
    """The counts minimising max_s |eq_s| (E >= e_low, a known bound),
    warm-started from the counts of placement `start`; None when no solution
    in time."""
    s_count, g = inputs.num_servers, inputs.gpus_per_server
    members: dict[tuple[int, int], int] = {}
    for m in inputs.models:
        key = (m.shards, _sign(round(m.r_bytes / MB)))
        members[key] = members.get(key, 0) + 1
    classes = tuple(sorted(members))
    k = len(classes)
    model = Model("aqua-placer-eq-counts")
    n = model.add_integers(
        k * s_count,
        0,
        np.tile([min(members[c], g // c[0]) for c in classes], s_count),
    ).reshape(s_count, k)
    size = np.array([c[0] for c in classes], dtype=np.float64)
    w = np.array([c[0] * c[1] for c in classes], dtype=np.float64)
    total = int(sum(abs(c[0] * c[1]) * members[c] for c in classes))
    big_e = int(model.add_integers(1, e_low, max(e_low, total))[0])
    for j, c in enumerate(classes):
        model.add_linear(n[:, j], 1.0, "==", float(members[c]))
    for s in range(s_count):
        model.add_linear(n[s], size, "<=", float(g))
        model.add_linear(np.append(n[s], big_e), np.append(-w, 1.0), ">=", 0.0)
        model.add_linear(np.append(n[s], big_e), np.append(w, 1.0), ">=", 0.0)
        if s + 1 < s_count:
            # Identical servers: eq_s non-increasing (symmetry breaking).
            model.add_linear(np.append(n[s], n[s + 1]), np.append(w, -w), ">=", 0.0)
    model.minimize([big_e], [1.0])
    hint = None
    if start is not None:
        index = {c: j for j, c in enumerate(classes)}
        have = np.zeros((s_count, k))
        for m, s in zip(inputs.models, start, strict=True):
            have[s, index[(m.shards, _sign(round(m.r_bytes / MB)))]] += 1
        eq0 = have @ w
        have = have[np.argsort(-eq0, kind="stable")]
        e0 = float(np.abs(eq0).max(initial=0))
        hint = (np.append(n.ravel(), big_e), np.append(have.ravel(), max(e0, e_low)))
    result = solve(
        model,
        time_limit_s=max(time_limit_s, 1e-3),
        backend=Backend.CPSAT,
        hint=hint,
        options=SolveOptions(),
    )
    if not result.has_solution:
        return None
    counts = np.rint(result.value(n)).astype(np.int64)
    eq = counts @ w.astype(np.int64)
    return EqCounts(
        int(np.abs(eq).max(initial=0)), result.status is Status.OPTIMAL, counts, classes
    )


def deal(inputs: PlacementInputs, counts: EqCounts) -> list[int]:
    """A placement with these counts: models, largest |R| first, each to the
    server with a free slot of its class where |mem_s| ends smallest."""
    s_count = inputs.num_servers
    index = {c: j for j, c in enumerate(counts.classes)}
    slots = counts.counts.copy()
    r = [round(m.r_bytes / MB) for m in inputs.models]
    mem = [0] * s_count
    servers = [-1] * len(inputs.models)
    for i in sorted(range(len(r)), key=lambda i: (-abs(r[i]), i)):
        j = index[(inputs.models[i].shards, _sign(r[i]))]
        best = min(
            (s for s in range(s_count) if slots[s, j] > 0),
            key=lambda s: (abs(mem[s] + r[i]), s),
        )
        slots[best, j] -= 1
        mem[best] += r[i]
        servers[i] = best
    return servers
