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
A fresh placement under the default objective starts from the two phases of
placer_phases.py (least max |eq|, proved; then memory under that cap) and is
answered without a solve when it meets their bound. Otherwise the solve is
warm-started from the current placement (models without one are placed
greedily); with no solution in time the warm start is returned, and failing
that the greedy placement, marked fallback.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

from planner.domain.placement import Placement, PlacementInputs, PlacerObjective
from planner.policies.aqua.placer_balance import mem_floor_mb
from planner.policies.aqua.placer_counts import deal, min_eq_counts
from planner.policies.aqua.placer_phases import Phased, eq_then_memory, phased_bound_mb
from planner.solvers import AUTO, Backend, Model, SolveOptions, Status, solve

MB = 10**6
DEFAULT_TIME_LIMIT_S = 2.0
# Default objective cost of one move: this fraction of a GPU's memory.
DEFAULT_MOVE_COST_FRACTION = 0.01
# Below this much time per model variable left for the solve, the solver is
# not called (translating the model alone would take longer; measured with
# CP-SAT: 1.8 s for 64k variables).
SOLVER_SETUP_S_PER_VAR = 30e-6
# The eq phase on counts (placer_counts.py) runs only with at least this much
# time per server left (measured: CP-SAT took 0.6 s on a 0.3 s limit at 128
# servers).
COUNTS_MIN_S_PER_SERVER = 2e-3
# Fresh placements (default objective): the eq phase may run until this
# share of the time limit, the memory phase until the next; the solver gets
# the rest unless the placement already meets the bound.
PATTERNS_SHARE = 0.4
BALANCE_SHARE = 0.7
# ... and the memory window proof (placer_window.py) until this share; when
# it ran, the full model is not solved (its LP bound stays at the mean).
PROOF_SHARE = 0.95
# ... or this share where the solver could not be set up in the rest.
NO_SOLVER_BALANCE_SHARE = 0.95


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
    server's |mem| + G_mem |eq| grows least; when that order strands a
    multi-shard model (no server with room left), again with the most shards
    first. None when they do not fit either way."""
    return _greedy(inputs, shards_first=False) or _greedy(inputs, shards_first=True)


def _greedy(inputs: PlacementInputs, shards_first: bool) -> list[int] | None:
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
        key=lambda i: (
            (-inputs.models[i].shards, -abs(inputs.models[i].r_bytes), i)
            if shards_first
            else (-abs(inputs.models[i].r_bytes), -inputs.models[i].shards, i)
        ),
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


def paired_placement(inputs: PlacementInputs) -> list[int] | None:
    """A fresh placement built from producer/consumer pairs: each producer
    goes with a consumer of the same shard count (largest |R| with largest
    |R|), a pair has eq 0; pairs and the models left over go, largest first,
    where the cluster's max |eq| and then max |mem| grow least (ties: the
    server's own |eq|, |mem|). With shard counts that are powers of two
    dividing the GPUs per server, largest-first never strands a model. None
    when models are already placed or they do not fit."""
    if any(m.current_server is not None for m in inputs.models):
        return None
    s_count, g = inputs.num_servers, inputs.gpus_per_server
    g_mem = round(inputs.gpu_memory_bytes / MB)
    r = [round(m.r_bytes / MB) for m in inputs.models]
    by_shards: dict[tuple[int, int], list[int]] = {}
    for i, m in enumerate(inputs.models):
        by_shards.setdefault((m.shards, _sign(r[i])), []).append(i)
    units: list[list[int]] = []
    for (k, sign), ids in by_shards.items():
        if sign < 0:
            continue
        producers = sorted(ids, key=lambda i: -abs(r[i]))
        consumers = sorted(by_shards.get((k, -1), []), key=lambda i: -abs(r[i])) if sign else []
        units += [[p, c] for p, c in zip(producers, consumers, strict=False)]
        units += [[i] for i in producers[len(consumers) :]]
        units += [[i] for i in consumers[len(producers) :]]
    for (shards, sign), ids in by_shards.items():
        if sign < 0 and not by_shards.get((shards, 1)):
            units += [[i] for i in ids]

    def size(u: list[int]) -> int:
        return sum(inputs.models[i].shards for i in u)

    def weq(u: list[int]) -> int:
        return sum(inputs.models[i].shards * _sign(r[i]) for i in u)

    def wmem(u: list[int]) -> int:
        return sum(r[i] for i in u)

    units.sort(key=lambda u: (-size(u), -abs(weq(u)), -abs(wmem(u))))
    servers = [-1] * len(inputs.models)
    used = [0] * s_count
    mem = [0] * s_count
    eq = [0] * s_count
    top_e = top_m = 0
    for u in units:
        k, e, um = size(u), weq(u), wmem(u)
        best: tuple[tuple[int, int, int], int] | None = None
        for s in range(s_count):
            if used[s] + k > g:
                continue
            ne, nm = abs(eq[s] + e), abs(mem[s] + um)
            key = (max(top_m, nm) + g_mem * max(top_e, ne), g_mem * ne + nm, used[s])
            if best is None or key < best[0]:
                best = (key, s)
        if best is None:
            return None
        s = best[1]
        used[s] += k
        mem[s] += um
        eq[s] += e
        top_e, top_m = max(top_e, abs(eq[s])), max(top_m, abs(mem[s]))
        for i in u:
            servers[i] = s
    return servers


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


def eq_lower_bound(inputs: PlacementInputs) -> int:
    """A lower bound on max_s |eq_s| (default objective), tighter than the
    mean ceil(|sum w| / S) by parity: when every model is a producer or a
    consumer, eq_s = p_s - c_s has the parity of the server's used GPUs
    p_s + c_s, so a full server cannot reach an |eq| of the other parity than
    its GPU count; only servers with a free GPU can, and there are at most as
    many as there are free GPUs."""
    s_count, g = inputs.num_servers, inputs.gpus_per_server
    w = [m.shards * _sign(round(m.r_bytes / MB)) for m in inputs.models]
    d = abs(sum(w))
    e = math.ceil(d / s_count)
    if any(v == 0 for v in w):
        return e
    free = s_count * g - sum(m.shards for m in inputs.models)
    while True:
        # The most sum_s eq_s can be with every |eq_s| <= e.
        most = s_count * e if (e - g) % 2 == 0 else s_count * (e - 1) + min(s_count, free)
        if d <= most:
            return e
        e += 1


def lower_bound_bytes(inputs: PlacementInputs) -> float | None:
    """A valid lower bound on the objective of a fresh placement (no model
    placed yet) under the default objective: a max is at least the mean, so
    max_s |mem_s| >= |sum R| / S (rounded up to the gcd of the R, in MB) and
    max_s |eq_s| >= eq_lower_bound. None where it does not apply."""
    if inputs.objective is not PlacerObjective.BALANCED_ABS or any(
        m.current_server is not None for m in inputs.models
    ):
        return None
    return _bound_with(inputs, eq_lower_bound(inputs))


def polish(
    inputs: PlacementInputs,
    servers: Sequence[int],
    passes: int = 50,
    deadline: float | None = None,
) -> list[int]:
    """Local search on the real objective of a fresh placement (default
    objective, no model placed yet; otherwise `servers` comes back as is):
    relocate one model or swap two when that lowers max_s |mem_s| +
    G_mem max_s |eq_s|, or keeps it and lowers sum_s mem_s^2 + (G_mem eq_s)^2
    (moves along plateaus of the max). Never worse than `servers`; stops
    within a few models' work after `deadline` (perf_counter seconds).

    `improve`'s smooth surrogate alone stalls far from the optimum on large
    clusters (a move that helps the max servers can raise the sum of
    squares); this one works on the max itself. Exact integer arithmetic
    (whole MB)."""
    if lower_bound_bytes(inputs) is None:
        return list(servers)
    models = inputs.models
    s_count, g = inputs.num_servers, inputs.gpus_per_server
    g_mem = round(inputs.gpu_memory_bytes / MB)
    r = [round(m.r_bytes / MB) for m in models]
    w = [m.shards * _sign(m.r_bytes) for m in models]
    sh = [m.shards for m in models]
    cur = list(servers)
    used = [0] * s_count
    mem = [0] * s_count
    eq = [0] * s_count
    for i, s in enumerate(cur):
        used[s] += sh[i]
        mem[s] += r[i]
        eq[s] += w[i]
    n = len(models)

    def sq(m: int, e: int) -> int:
        return m * m + (g_mem * e) ** 2

    def top(values: list[int]) -> list[tuple[int, int]]:
        return sorted(((abs(v), k) for k, v in enumerate(values)), reverse=True)[:3]

    def other(tp: list[tuple[int, int]], a: int, b: int) -> int:
        return next((v for v, k in tp if k not in (a, b)), 0)

    def state() -> tuple[list[tuple[int, int]], list[tuple[int, int]], int]:
        tm, te = top(mem), top(eq)
        return tm, te, tm[0][0] + g_mem * te[0][0]

    def late() -> bool:
        return deadline is not None and time.perf_counter() > deadline

    for _ in range(passes):
        changed = False
        tm, te, obj = state()
        for i in range(n):
            if i % 32 == 0 and late():
                return cur
            a = cur[i]
            best: tuple[tuple[int, int], int] | None = None
            for t in range(s_count):
                if t == a or used[t] + sh[i] > g:
                    continue
                ma, mt, ea, et = mem[a] - r[i], mem[t] + r[i], eq[a] - w[i], eq[t] + w[i]
                new = max(other(tm, a, t), abs(ma), abs(mt)) + g_mem * max(
                    other(te, a, t), abs(ea), abs(et)
                )
                if new > obj:
                    continue
                dsq = sq(ma, ea) + sq(mt, et) - sq(mem[a], eq[a]) - sq(mem[t], eq[t])
                if (new < obj or dsq < 0) and (best is None or (new, dsq) < best[0]):
                    best = ((new, dsq), t)
            if best is not None:
                t = best[1]
                cur[i] = t
                used[a] -= sh[i]
                used[t] += sh[i]
                mem[a] -= r[i]
                mem[t] += r[i]
                eq[a] -= w[i]
                eq[t] += w[i]
                tm, te, obj = state()
                changed = True
        for i in range(n):
            if i % 16 == 0 and late():
                return cur
            for j in range(i + 1, n):
                a, b = cur[i], cur[j]
                if a == b or (r[i] == r[j] and w[i] == w[j]):
                    continue
                if used[a] - sh[i] + sh[j] > g or used[b] - sh[j] + sh[i] > g:
                    continue
                dm, de = r[j] - r[i], w[j] - w[i]
                ma, mb, ea, eb = mem[a] + dm, mem[b] - dm, eq[a] + de, eq[b] - de
                new = max(other(tm, a, b), abs(ma), abs(mb)) + g_mem * max(
                    other(te, a, b), abs(ea), abs(eb)
                )
                if new > obj:
                    continue
                if new < obj or sq(ma, ea) + sq(mb, eb) < sq(mem[a], eq[a]) + sq(mem[b], eq[b]):
                    cur[i], cur[j] = b, a
                    used[a] += sh[j] - sh[i]
                    used[b] += sh[i] - sh[j]
                    mem[a], mem[b], eq[a], eq[b] = ma, mb, ea, eb
                    tm, te, obj = state()
                    changed = True
        if not changed or late():
            break
    return cur


def first_appearance_order(servers: Sequence[int]) -> list[int]:
    """The same placement with servers renumbered in the order models first
    use them (what the symmetry breaking of build_model admits)."""
    label: dict[int, int] = {}
    for s in servers:
        label.setdefault(s, len(label))
    return [label[s] for s in servers]


def _gap(value: float, bound: float) -> float:
    return 0.0 if value <= bound else (value - bound) / abs(value)


def _bound_with(inputs: PlacementInputs, e_low: int) -> float:
    g_mem = round(inputs.gpu_memory_bytes / MB)
    return float((mem_floor_mb(inputs) + g_mem * e_low) * MB)


def build_model(
    inputs: PlacementInputs, e_low: int | None = None
) -> tuple[Model, np.ndarray, int, int]:
    """The ILP; returns it, x (models x servers ids), and the ids of M and E.
    e_low: a known lower bound on E (default eq_lower_bound)."""
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
    # solver's bound: M >= |sum R| / S rounded up, E >= eq_lower_bound (the
    # mean, rounded up, then raised by parity).
    m_low = math.ceil(abs(r.sum()) / s_count)
    e_low = eq_lower_bound(inputs) if e_low is None else e_low
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
    current = [m.current_server for m in inputs.models]
    phased: Phased | None = None
    # The warm start's share of the budget: half, or nearly all where the
    # solver could not even be set up in the rest (1,024 GPUs under 5 s).
    share, balance_share = 0.5, BALANCE_SHARE
    if SOLVER_SETUP_S_PER_VAR * n * s_count > 0.3 * time_limit_s:
        share, balance_share = 0.75, NO_SOLVER_BALANCE_SHARE
    start: list[int] | None
    if all(c is not None for c in current) and fits(
        inputs, [int(c) for c in current if c is not None]
    ):
        start = [int(c) for c in current if c is not None]
    else:
        if lower_bound_bytes(inputs) is not None:
            # Fresh, default objective: the phases (placer_phases.py);
            # the greedy path below only where they give no answer in time.
            phased = eq_then_memory(
                inputs,
                None,
                eq_lower_bound(inputs),
                eq_deadline=started + PATTERNS_SHARE * time_limit_s,
                memory_deadline=started + balance_share * time_limit_s,
                proof_deadline=started + PROOF_SHARE * time_limit_s,
            )
        if phased is not None:
            start = phased.servers
        else:
            start = greedy_placement(inputs)
            if start is not None and not fits(inputs, start):
                start = None
        if phased is None and start is not None:
            # Local search gets at most half of the budget.
            start = improve(inputs, start, deadline=started + share * time_limit_s * 0.5)
            start = polish(inputs, start, deadline=started + share * time_limit_s * 0.75)
        paired = None if phased is not None else paired_placement(inputs)
        if paired is not None:
            paired = polish(inputs, paired, deadline=started + share * time_limit_s)
            if start is None or evaluate(inputs, paired)[0] < evaluate(inputs, start)[0]:
                start = paired
    e_low: int | None = None
    bound = lower_bound_bytes(inputs)
    if bound is not None and phased is not None:
        e_low = phased.e_star
        bound = float(phased_bound_mb(inputs, phased) * MB)
    elif bound is not None:
        # The eq phase on aggregated counts (placer_counts.py): a placement
        # with the least max |eq| and, when proved, a tighter bound on E.
        e_low = eq_lower_bound(inputs)
        start_e = None if start is None else max(abs(v) for v in evaluate(inputs, start)[2])
        budget = time_limit_s * (share + 0.1) - (time.perf_counter() - started)
        # CP-SAT overruns limits much below ~2 ms per server on this model.
        if (start_e is None or start_e > e_low) and budget > COUNTS_MIN_S_PER_SERVER * s_count:
            counts = min_eq_counts(inputs, e_low, min(budget, time_limit_s * share / 2), start)
            if counts is not None:
                if counts.proved:
                    e_low = max(e_low, counts.e)
                dealt = deal(inputs, counts)
                dealt = polish(inputs, dealt, deadline=started + time_limit_s * (share + 0.2))
                if fits(inputs, dealt) and (
                    start is None or evaluate(inputs, dealt)[0] < evaluate(inputs, start)[0]
                ):
                    start = dealt
        bound = _bound_with(inputs, e_low)
    if start is not None and all(m.current_server is None for m in inputs.models):
        start = first_appearance_order(start)
    if start is not None and bound is not None:
        value = evaluate(inputs, start)[0]
        if value - bound <= relative_gap * value:
            # The warm start is within the gap asked of a lower bound: no solve needed.
            value, mem, eq, moves = evaluate(inputs, start)
            return Placement(
                servers=tuple(start),
                objective_bytes=value,
                mem_bytes=tuple(mem),
                eq=tuple(eq),
                moves=moves,
                status="OPTIMAL" if value <= bound else "FEASIBLE",
                backend=str(backend),
                best_bound_bytes=bound,
                gap=_gap(value, bound),
                wall_time_s=time.perf_counter() - started,
                note="the warm start meets the lower bound (memory floor + G_mem x the least "
                "max |eq|)" + ("" if value <= bound else f" within relative_gap {relative_gap:g}"),
            )
    if start is not None and bound is not None and phased is not None and phased.thresholds:
        # The memory window proof had the solver's time: the full model
        # would start from the same placement with a weaker bound.
        value, mem, eq, moves = evaluate(inputs, start)
        tried = ", ".join(f"{t / 1000:g} GB {said}" for t, said in phased.thresholds)
        return Placement(
            servers=tuple(start),
            objective_bytes=value,
            mem_bytes=tuple(mem),
            eq=tuple(eq),
            moves=moves,
            status="FEASIBLE",
            backend=str(backend),
            best_bound_bytes=bound,
            gap=_gap(value, bound),
            wall_time_s=time.perf_counter() - started,
            note=f"memory window proof (max |mem| <= T under the least max |eq|): {tried}",
        )
    num_vars = n * s_count + 2  # x, M and E
    left = time_limit_s - (time.perf_counter() - started)
    if start is not None and left < SOLVER_SETUP_S_PER_VAR * num_vars:
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
            best_bound_bytes=bound,
            gap=None if bound is None else _gap(value, bound),
            fallback=True,
            note=f"{left:.3f} s left is too little to set up the solver for "
            f"{num_vars} variables; warm start (no solver)",
        )
    model, x, big_m, big_e = build_model(inputs, e_low)
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
    solver_bound = None if result.best_bound is None or fallback_used else result.best_bound * MB
    gap = None if fallback_used else result.gap
    if bound is not None and (solver_bound is None or bound > solver_bound):
        # Our bound (the proved least max |eq|) is tighter than the solver's.
        gap = _gap(value, bound)
    elif solver_bound is not None:
        bound = solver_bound
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
