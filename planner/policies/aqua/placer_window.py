"""The placer's memory proof: with max_s |eq_s| held at the cap E*, the
least max_s |mem_s| decided by CP-SAT, one threshold at a time.

For a threshold T every server's memory lies in a window: |mem_s| <= T, and
since the servers' memories sum to sum R, also
mem_s >= sum R - (S - 1) T (and <= sum R + (S - 1) T). With the window, the
GPU capacity and |eq_s| <= cap, "is there a placement with max |mem| <= T?"
is a feasibility model on x[m, s] whose propagation is strong where T is
close to the mean (the window is then a few GB wide), so CP-SAT often proves
it infeasible in seconds where the min-max model's LP bound never moves off
the mean. A proof at T raises the memory floor to T + step; a solution is a
better placement.

Thresholds are tried from the bottom (the floor, raised one step per proof)
with half of the time, then from the top (the placement's max minus one
step: a proof there makes the placement optimal) with the rest.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.domain.placement import PlacementInputs
from planner.solvers import Backend, Model, SolveOptions, Status, solve

MB = 10**6
# Below this much time for one threshold the solver is not called.
MIN_SOLVE_S = 0.02
# The share of the time for thresholds from the floor up (the rest: from
# the placement's max down).
BOTTOM_UP_SHARE = 0.5


@dataclass(frozen=True)
class MemoryProof:
    servers: list[int]  # the best placement seen (never worse than the given one)
    floor_mb: int  # a proved lower bound on max_s |mem_s| over placements with |eq| <= cap
    thresholds: tuple[tuple[int, str], ...]  # (T in MB, what the solver said), in order


def window(total_mb: int, s_count: int, t: int) -> tuple[int, int]:
    """The range of mem_s (MB) in any placement with every |mem_s| <= t."""
    return max(-t, total_mb - (s_count - 1) * t), min(t, total_mb + (s_count - 1) * t)


def max_abs_mem_mb(inputs: PlacementInputs, servers: Sequence[int]) -> int:
    mem = [0] * inputs.num_servers
    for m, s in zip(inputs.models, servers, strict=True):
        mem[s] += round(m.r_bytes / MB)
    return max((abs(v) for v in mem), default=0)


def feasible_at(
    inputs: PlacementInputs, cap: int, t: int, time_limit_s: float, threads: int = 1
) -> tuple[Status, list[int] | None]:
    """CP-SAT on "every server's memory in window(t), |eq| <= cap, GPUs fit":
    (status, a placement when one was found). No hint: hinting the placement
    above t slowed the proofs down (64 GPUs: T = 13 GB unproved in 1.7 s,
    proved in 1 s without)."""
    models = inputs.models
    n, s_count = len(models), inputs.num_servers
    r = np.array([round(m.r_bytes / MB) for m in models], dtype=np.float64)
    sh = np.array([m.shards for m in models], dtype=np.float64)
    lo, hi = window(int(r.sum()), s_count, t)
    if lo > hi:
        return Status.INFEASIBLE, None
    model = Model("aqua-placer-memory-window")
    x = model.add_binaries(n * s_count).reshape(n, s_count)
    model.add_exactly_one_groups(x)
    # Servers are interchangeable: the k-th model (most shards, then largest
    # |R| first) goes to one of servers 0..k (keeps at least one solution).
    order = sorted(range(n), key=lambda i: (-models[i].shards, -abs(r[i]), i))
    banned = [int(x[i, s]) for k, i in enumerate(order) for s in range(k + 1, s_count)]
    if banned:
        model.add_linear(banned, 1.0, "==", 0.0)
    # Producer and consumer GPUs per server as integer variables: with them
    # CP-SAT proves 4x faster (64 GPUs, T = 13 GB: 0.46 s against 1.7 s;
    # 128 GPUs, T = 6 GB: 2.0 s against nothing in 20 s, one thread).
    g = inputs.gpus_per_server
    gpus = model.add_integers(2 * s_count, 0, g).reshape(s_count, 2)
    producer, consumer, neutral = r > 0, r < 0, r == 0
    for s in range(s_count):
        col = x[:, s]
        p, c = int(gpus[s, 0]), int(gpus[s, 1])
        model.add_linear(np.append(col[producer], p), np.append(-sh[producer], 1.0), "==", 0.0)
        model.add_linear(np.append(col[consumer], c), np.append(-sh[consumer], 1.0), "==", 0.0)
        model.add_linear(
            np.append(col[neutral], [p, c]), np.append(sh[neutral], [1.0, 1.0]), "<=", float(g)
        )
        model.add_linear([p, c], [1.0, -1.0], "<=", float(cap))
        model.add_linear([p, c], [1.0, -1.0], ">=", float(-cap))
        model.add_linear(col[~neutral], r[~neutral], "<=", float(hi))
        model.add_linear(col[~neutral], r[~neutral], ">=", float(lo))
    result = solve(
        model,
        time_limit_s=time_limit_s,
        backend=Backend.CPSAT,
        options=SolveOptions(threads=threads, hint_fallback=False),
    )
    if result.has_solution:
        return result.status, [int(s) for s in result.value(x).argmax(axis=1)]
    return result.status, None


def prove_memory(
    inputs: PlacementInputs,
    servers: Sequence[int],
    cap: int,
    floor_mb: int,
    deadline: float,
) -> MemoryProof:
    """Lower max |mem| below that of `servers` (which must keep |eq| <= cap)
    or prove it cannot be, until `deadline` (perf_counter seconds)."""
    r = [round(m.r_bytes / MB) for m in inputs.models]
    step = math.gcd(*r) or 1
    best = list(servers)
    best_mb = max_abs_mem_mb(inputs, best)
    floor = floor_mb
    said: list[tuple[int, str]] = []

    def attempt(t: int, until: float) -> Status | None:
        nonlocal best, best_mb, floor
        left = until - time.perf_counter()
        if left < MIN_SOLVE_S:
            return None
        status, found = feasible_at(inputs, cap, t, left)
        said.append((t, str(status)))
        if status is Status.INFEASIBLE:
            floor = max(floor, t + step)
        elif found is not None:
            best, best_mb = found, max_abs_mem_mb(inputs, found)
        return status

    started = time.perf_counter()
    half = started + BOTTOM_UP_SHARE * (deadline - started)
    while best_mb > floor:
        if attempt(floor, half) is not Status.INFEASIBLE:
            break
    while best_mb > floor:
        status = attempt(best_mb - step, deadline)
        if status not in {Status.OPTIMAL, Status.FEASIBLE}:
            break
    return MemoryProof(best, min(floor, best_mb), tuple(said))
