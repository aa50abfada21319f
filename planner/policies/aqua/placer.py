"""AQUA-PLACER (DESIGN.md §3.4) as a `planner.solvers` formulation.

Variables x[m, s] in {0, 1}: model m (all its tensor-parallel shards) on
server s; exactly one server per model; shards per server <= GPUs per server.
mem_s = sum_m x R_m (R > 0 producer surplus, < 0 consumer demand) and
eq_s = sum_m x shards_m sign(R_m) (producer minus consumer GPUs: the paper
has one variable per shard, so its count is per GPU).

Objective (ours, the default): max_s |mem_s| + G_mem * max_s |eq_s|, so
imbalance in either direction counts. PAPER: Eq. 6 as printed,
max_s mem_s + G_mem * max_s eq_s. Both add move_cost per already-placed model
that changes server, and at most max_moves of them may move.

Memory is counted in whole MB (1e6 bytes) inside the model, so every
coefficient and the objective are integers and CP-SAT's optimum is exact.
The solve is warm-started from the current placement (models without one are
placed greedily); with no solution in time the warm start is returned, and
failing that the greedy placement, marked fallback.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

from planner.domain.placement import Placement, PlacementInputs, PlacerObjective
from planner.solvers import AUTO, Backend, Model, SolveOptions, Status, solve

MB = 10**6
DEFAULT_TIME_LIMIT_S = 2.0
# Default objective cost of one move: this fraction of a GPU's memory.
DEFAULT_MOVE_COST_FRACTION = 0.01
# Below this much time per model variable left for the solve, the solver is
# not called (translating the model alone would take longer; measured with
# CP-SAT: 1.8 s for 64k variables).
SOLVER_SETUP_S_PER_VAR = 30e-6


def _sign(r: int) -> int:
    return (r > 0) - (r < 0)


def check_inputs(inputs: PlacementInputs) -> None:
    """ValueError naming what cannot be placed."""
    if inputs.num_servers <= 0 or inputs.gpus_per_server <= 0:
        raise ValueError("num_servers and gpus_per_server must be > 0")
    for m in inputs.models:
        if not 1 <= m.shards <= inputs.gpus_per_server:
            raise ValueError(
                f"model {m.id!r}: {m.shards} shards do not fit on one server of "
                f"{inputs.gpus_per_server} GPUs"
            )
        if m.current_server is not None and not 0 <= m.current_server < inputs.num_servers:
            raise ValueError(f"model {m.id!r}: current_server {m.current_server} out of range")
    total = sum(m.shards for m in inputs.models)
    if total > inputs.num_servers * inputs.gpus_per_server:
        raise ValueError(
            f"{total} shards need more than {inputs.num_servers} x {inputs.gpus_per_server} GPUs"
        )
    if inputs.max_moves is not None and inputs.max_moves < 0:
        raise ValueError("max_moves must be >= 0")


def move_cost_bytes(inputs: PlacementInputs) -> int:
    if inputs.move_cost_bytes is not None:
        return inputs.move_cost_bytes
    return round(DEFAULT_MOVE_COST_FRACTION * inputs.gpu_memory_bytes)


def evaluate(
    inputs: PlacementInputs, servers: Sequence[int]
) -> tuple[float, list[int], list[int], int]:
    """(objective bytes, mem_s, eq_s, moves) of an assignment (in MB-rounded
    requirements, as the solver sees them, scaled back to bytes)."""
    s_count = inputs.num_servers
    mem = [0] * s_count
    eq = [0] * s_count
    moves = 0
    for m, s in zip(inputs.models, servers, strict=True):
        mem[s] += round(m.r_bytes / MB)
        eq[s] += m.shards * _sign(m.r_bytes)
        if m.current_server is not None and m.current_server != s:
            moves += 1
    g_mem = round(inputs.gpu_memory_bytes / MB)
    if inputs.objective is PlacerObjective.PAPER:
        value = max(mem) + g_mem * max(eq)
    else:
        value = max(abs(v) for v in mem) + g_mem * max(abs(v) for v in eq)
    value += round(move_cost_bytes(inputs) / MB) * moves
    return float(value * MB), [v * MB for v in mem], eq, moves


def fits(inputs: PlacementInputs, servers: Sequence[int]) -> bool:
    used = [0] * inputs.num_servers
    for m, s in zip(inputs.models, servers, strict=True):
        used[s] += m.shards
    if max(used, default=0) > inputs.gpus_per_server:
        return False
    if inputs.max_moves is not None:
        moved = sum(
            1
            for m, s in zip(inputs.models, servers, strict=True)
            if m.current_server is not None and m.current_server != s
        )
        return moved <= inputs.max_moves
    return True


def greedy_placement(inputs: PlacementInputs) -> list[int] | None:
    """Placed models stay; the others, largest |R| first, go where the
    server's |mem| + G_mem |eq| grows least. None when they do not fit."""
    s_count, g = inputs.num_servers, inputs.gpus_per_server
    g_mem = inputs.gpu_memory_bytes
    servers: list[int | None] = [None] * len(inputs.models)
    used = [0] * s_count
    mem = [0] * s_count
    eq = [0] * s_count
    for i, m in enumerate(inputs.models):
        if m.current_server is not None and used[m.current_server] + m.shards <= g:
            servers[i] = m.current_server
            used[m.current_server] += m.shards
            mem[m.current_server] += m.r_bytes
            eq[m.current_server] += m.shards * _sign(m.r_bytes)
    order = sorted(
        (i for i in range(len(inputs.models)) if servers[i] is None),
        key=lambda i: (-abs(inputs.models[i].r_bytes), -inputs.models[i].shards, i),
    )
    for i in order:
        m = inputs.models[i]
        w = m.shards * _sign(m.r_bytes)
        # The cluster's objective after the move: the largest |mem| and |eq|
        # over the other servers (top two) and this one.
        abs_mem = sorted(((abs(v), k) for k, v in enumerate(mem)), reverse=True)[:2]
        abs_eq = sorted(((abs(v), k) for k, v in enumerate(eq)), reverse=True)[:2]
        best = None
        for s in range(s_count):
            if used[s] + m.shards > g:
                continue
            other_mem = next((v for v, k in abs_mem if k != s), 0)
            other_eq = next((v for v, k in abs_eq if k != s), 0)
            new_mem, new_eq = abs(mem[s] + m.r_bytes), abs(eq[s] + w)
            score = max(other_mem, new_mem) + g_mem * max(other_eq, new_eq)
            key = (score, new_mem + g_mem * new_eq, used[s], s)
            if best is None or key < best[0]:
                best = (key, s)
        if best is None:
            return None
        s = best[1]
        servers[i] = s
        used[s] += m.shards
        mem[s] += m.r_bytes
        eq[s] += w
    out = [s for s in servers if s is not None]
    return out if len(out) == len(servers) else None


def improve(
    inputs: PlacementInputs,
    servers: Sequence[int],
    passes: int = 8,
    deadline: float | None = None,
) -> list[int]:
    """Local search from a placement: relocate one model or swap two while
    that lowers sum_s (|mem_s| + G_mem |eq_s|)^2 (a smooth stand-in for the
    max objective that also moves off plateaus); returns the best placement
    by the real objective seen. Models with a current server stay put when
    max_moves is set. At most `passes` sweeps, fewer when a sweep ends past
    `deadline` (perf_counter seconds)."""
    models = inputs.models
    s_count, g = inputs.num_servers, inputs.gpus_per_server
    g_mem = inputs.gpu_memory_bytes / MB
    r = [m.r_bytes / MB for m in models]
    w = [m.shards * _sign(m.r_bytes) for m in models]
    cur = list(servers)
    used = [0] * s_count
    mem = [0.0] * s_count
    eq = [0] * s_count
    for i, s in enumerate(cur):
        used[s] += models[i].shards
        mem[s] += r[i]
        eq[s] += w[i]
    movable = [
        i for i, m in enumerate(models) if inputs.max_moves is None or m.current_server is None
    ]

    def cost(s: int, dm: float, de: int) -> float:
        return (abs(mem[s] + dm) + g_mem * abs(eq[s] + de)) ** 2

    best = list(cur)
    best_value = evaluate(inputs, cur)[0]
    for _ in range(passes):
        changed = False
        for i in movable:
            a = cur[i]
            base_a = cost(a, 0, 0)
            for t in range(s_count):
                if t == a:
                    continue
                if used[t] + models[i].shards <= g:
                    delta = cost(a, -r[i], -w[i]) + cost(t, r[i], w[i]) - base_a - cost(t, 0, 0)
                    if delta < -1e-9:
                        cur[i] = t
                        used[a] -= models[i].shards
                        used[t] += models[i].shards
                        mem[a] -= r[i]
                        mem[t] += r[i]
                        eq[a] -= w[i]
                        eq[t] += w[i]
                        changed = True
                        break
            else:
                continue
        for i in movable:
            for j in movable:
                a, b = cur[i], cur[j]
                if j <= i or a == b:
                    continue
                di, dj = models[i].shards, models[j].shards
                if used[a] - di + dj > g or used[b] - dj + di > g:
                    continue
                dm, de = r[j] - r[i], w[j] - w[i]
                delta = cost(a, dm, de) + cost(b, -dm, -de) - cost(a, 0, 0) - cost(b, 0, 0)
                if delta < -1e-9:
                    cur[i], cur[j] = b, a
                    used[a] += dj - di
                    used[b] += di - dj
                    mem[a] += dm
                    mem[b] -= dm
                    eq[a] += de
                    eq[b] -= de
                    changed = True
        value = evaluate(inputs, cur)[0]
        if value < best_value and fits(inputs, cur):
            best, best_value = list(cur), value
        if not changed or (deadline is not None and time.perf_counter() > deadline):
            break
    return best


def first_appearance_order(servers: Sequence[int]) -> list[int]:
    """The same placement with servers renumbered in the order models first
    use them (what the symmetry breaking of build_model admits)."""
    label: dict[int, int] = {}
    for s in servers:
        label.setdefault(s, len(label))
    return [label[s] for s in servers]


def build_model(inputs: PlacementInputs) -> tuple[Model, np.ndarray, int, int]:
    """The ILP; returns it, x (models x servers ids), and the ids of M and E."""
    n, s_count = len(inputs.models), inputs.num_servers
    r = np.array([round(m.r_bytes / MB) for m in inputs.models], dtype=np.float64)
    shards = np.array([m.shards for m in inputs.models], dtype=np.float64)
    w = shards * np.sign(r)
    g_mem = round(inputs.gpu_memory_bytes / MB)
    model = Model("aqua-placer")
    x = model.add_binaries(n * s_count).reshape(n, s_count)
    model.add_exactly_one_groups(x)

    # One row per server over its column of x (sparse: a dense servers x
    # (models x servers) matrix is 65 MB at 1,024 GPUs).
    def at_most(coefs: np.ndarray, rhs: float) -> None:
        nz = coefs != 0
        for s in range(s_count):
            model.add_linear(x[nz, s], coefs[nz], "<=", rhs)

    def max_lower_bound(y: int, coefs: np.ndarray) -> None:
        """y >= coefs @ x[:, s] for every server s."""
        nz = coefs != 0
        for s in range(s_count):
            model.add_linear(np.append(x[nz, s], y), np.append(-coefs[nz], 1.0), ">=", 0.0)

    at_most(shards, float(inputs.gpus_per_server))
    mem_bound = float(np.abs(r).sum())
    eq_bound = float(np.abs(w).sum())
    paper = inputs.objective is PlacerObjective.PAPER
    # Continuous on an integer grid (resolution 1): exact in CP-SAT, and the
    # exhaustive backend sets them from the enumerated x.
    # Valid lower bounds (a max is at least the mean) that tighten the
    # solver's bound: M >= |sum R| / S, E >= |sum w| / S, rounded up.
    m_low = math.ceil(abs(r.sum()) / s_count)
    e_low = math.ceil(abs(w.sum()) / s_count)
    if paper:
        m_low, e_low = math.ceil(r.sum() / s_count), math.ceil(w.sum() / s_count)
    big_m = model.add_continuous(1, m_low, max(mem_bound, m_low), resolution=1.0)[0]
    big_e = model.add_continuous(1, e_low, max(eq_bound, e_low), resolution=1.0)[0]
    max_lower_bound(big_m, r)
    max_lower_bound(big_e, w)
    if not paper:
        max_lower_bound(big_m, -r)
        max_lower_bound(big_e, -w)
    if all(m.current_server is None for m in inputs.models):
        # Servers are interchangeable: model i goes to one of servers 0..i
        # (symmetry breaking; keeps at least one optimum).
        banned = [int(x[i, j]) for i in range(n) for j in range(i + 1, s_count)]
        if banned:
            model.add_linear(banned, 1.0, "==", 0.0)
    stay = [
        int(x[i, m.current_server])
        for i, m in enumerate(inputs.models)
        if m.current_server is not None
    ]
    if stay and inputs.max_moves is not None:
        model.add_linear(stay, 1.0, ">=", float(len(stay) - inputs.max_moves))
    cost = round(move_cost_bytes(inputs) / MB)
    obj_vars = [big_m, big_e, *stay]
    obj_coefs = [1.0, float(g_mem), *([-float(cost)] * len(stay))]
    model.minimize(obj_vars, obj_coefs, constant=float(cost * len(stay)))
    return model, x, int(big_m), int(big_e)


def place_models(
    inputs: PlacementInputs,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    backend: str = "cpsat",
    relative_gap: float = 0.0,
) -> Placement:
    """The placement; raises ValueError when the models cannot fit.
    time_limit_s covers the whole call (warm start, model, solve)."""
    started = time.perf_counter()
    check_inputs(inputs)
    n, s_count = len(inputs.models), inputs.num_servers
    if n == 0:
        return Placement((), 0.0, (0,) * s_count, (0,) * s_count, 0, "OPTIMAL", "none")
    model, x, big_m, big_e = build_model(inputs)
    current = [m.current_server for m in inputs.models]
    start: list[int] | None
    if all(c is not None for c in current) and fits(
        inputs, [int(c) for c in current if c is not None]
    ):
        start = [int(c) for c in current if c is not None]
    else:
        start = greedy_placement(inputs)
        if start is not None and not fits(inputs, start):
            start = None
        if start is not None:
            # Local search gets at most half of the budget.
            start = improve(inputs, start, deadline=started + time_limit_s / 2)
    if start is not None and all(m.current_server is None for m in inputs.models):
        start = first_appearance_order(start)
    hint = None
    if start is not None:
        xs = np.zeros((n, s_count))
        xs[np.arange(n), start] = 1.0
        _, mem, eq, _ = evaluate(inputs, start)
        mem_mb = [v // MB for v in mem]
        if inputs.objective is PlacerObjective.PAPER:
            m_val, e_val = max(mem_mb), max(eq)
        else:
            m_val, e_val = max(abs(v) for v in mem_mb), max(abs(v) for v in eq)
        hint = (
            np.append(x.ravel(), [big_m, big_e]),
            np.append(xs.ravel(), [float(m_val), float(e_val)]),
        )
    left = time_limit_s - (time.perf_counter() - started)
    if start is not None and left < SOLVER_SETUP_S_PER_VAR * model.num_vars:
        # Handing the model to the solver alone would overrun the limit
        # (CP-SAT: ~1.8 s at 1,024 GPUs); answer the warm start.
        value, mem, eq, moves = evaluate(inputs, start)
        return Placement(
            servers=tuple(start),
            objective_bytes=value,
            mem_bytes=tuple(mem),
            eq=tuple(eq),
            moves=moves,
            status="FEASIBLE",
            backend=str(backend),
            wall_time_s=time.perf_counter() - started,
            fallback=True,
            note=f"{left:.3f} s left is too little to set up the solver for "
            f"{model.num_vars} variables; warm start (greedy + local search)",
        )
    chosen = AUTO if backend == AUTO else Backend(backend)
    fallback = Backend.CPSAT if chosen == Backend.GUROBI else None
    result = solve(
        model,
        time_limit_s=max(time_limit_s - (time.perf_counter() - started), 1e-3),
        backend=chosen,
        fallback=fallback,
        hint=hint,
        options=SolveOptions(relative_gap=relative_gap),
    )
    if result.status is Status.INFEASIBLE:
        raise ValueError("no placement satisfies the GPU capacity and max_moves limits")
    if result.has_solution:
        servers = [int(s) for s in result.value(x).argmax(axis=1)]
        fallback_used = False
        note = result.note
        if start is not None and evaluate(inputs, start)[0] < evaluate(inputs, servers)[0]:
            # The solver's hint is only a hint: never answer worse than it.
            servers = start
            note = (
                f"{note}; the warm start beat the solver's solution"
                if note
                else ("the warm start beat the solver's solution")
            )
    elif start is not None:
        servers, fallback_used = start, True
        note = f"{result.status}: {result.note or 'no solution in time'}; greedy placement"
    else:
        raise ValueError(f"no placement found in time ({result.status})")
    value, mem, eq, moves = evaluate(inputs, servers)
    bound = None if result.best_bound is None or fallback_used else result.best_bound * MB
    gap = None if fallback_used else result.gap
    return Placement(
        servers=tuple(servers),
        objective_bytes=value,
        mem_bytes=tuple(mem),
        eq=tuple(eq),
        moves=moves,
        status=str(result.status) if not fallback_used else "FEASIBLE",
        backend=str(result.backend),
        best_bound_bytes=bound,
        gap=gap,
        wall_time_s=time.perf_counter() - started,
        fallback=fallback_used,
        note=note,
    )
