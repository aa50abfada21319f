"""plan_layer_offload: OrbitFlow's placement planner (DESIGN.md §3.2).

1. Candidate patterns per request (pruned by distance, or a larger space).
2. Window options Delta in {min, 2 min, 4 min, ..., max}, each with its
   latency ceiling from the requests' SLOs and Token-Deposit balances
   (window.py), and the KV each request holds at its end.
3. The ILP (ilp.py) over the running requests. Infeasible: Pause-Resume
   pauses the request with the most KV blocks plus deposited tokens and
   re-solves. No solution in time (or a solver error): the greedy plan
   (greedy.py) for that batch, said in the plan.
4. Paused requests that arrived paused are resumed one by one, in the order
   given, when a feasible plan includes them; only when nothing had to be
   paused in this call (an overload that forced a pause has not cleared).
5. The window is extended step by step while the chosen placement still
   fits and keeps its violations within the cap (the ILP's window checks are
   conservative); the plan expires at step + window.
6. The placement is scored with the exact event model, the surrogate and
   the paper's Algorithm 1.

Pure: no clock but the solver's own time limit, no I/O.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from planner.domain.offload import (
    DecodeBatch,
    OffloadInputs,
    OffloadPlan,
    Placement,
    PlanSource,
)
from planner.policies.offload.greedy import greedy_choice
from planner.policies.offload.ilp import OffloadIlp, WindowOption, build_offload_ilp
from planner.policies.offload.local_search import STAGGER_REQUESTS
from planner.policies.offload.memory import gpu_blocks_needed, prefetch_buffer_blocks
from planner.policies.offload.paper_model import paper_latency_s
from planner.policies.offload.problem import OffloadProblem, offload_problem
from planner.policies.offload.search import SPREAD_IDLE_SHARE, branch_and_bound, warm_up
from planner.policies.offload.search_space import OffloadCandidates, candidate_patterns
from planner.policies.offload.step import StepInputs
from planner.policies.offload.step_kernels import exact_latency_of
from planner.policies.offload.surrogate import surrogate_latency_s
from planner.policies.offload.window import latency_ceiling_s, violations_per_step
from planner.solvers import Backend, SolveOptions, SolveStats, Status, solve

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

MAX_ENUMERATION = SolveOptions().max_enumeration
# A solve is always given at least this long (and this many nodes), even when
# an earlier Pause-Resume round used up the plan's limits.
MIN_SOLVE_S = 0.002
MIN_SOLVE_NODES = 1


def window_grid(min_steps: int, max_steps: int) -> list[int]:
    """min, 2 min, 4 min, ... below max, then max."""
    if not 1 <= min_steps <= max_steps:
        raise ValueError(
            f"need 1 <= min_window_steps <= max_window_steps, got {min_steps}, {max_steps}"
        )
    grid = []
    w = min_steps
    while w < max_steps:
        grid.append(w)
        w *= 2
    grid.append(max_steps)
    return grid


def end_blocks(batch: DecodeBatch, steps: int, block_size: int) -> IntArray:
    """Blocks per layer each request holds during the window's last step:
    its KV then has num_tokens + steps tokens (fewer when it finishes)."""
    grown = np.where(batch.steps_left < 0, steps, np.minimum(batch.steps_left, steps))
    blocks: IntArray = -(-(batch.num_tokens + np.maximum(grown, 1)) // block_size)
    return blocks


def window_options(batch: DecodeBatch, inputs: OffloadInputs) -> list[WindowOption]:
    p = inputs.params
    return [
        WindowOption(
            steps=w,
            ceiling_s=latency_ceiling_s(
                w, batch.deposited_tokens, batch.slo_tbt_s, p.violation_cap, batch.steps_left
            ),
            end_blocks=end_blocks(batch, w, inputs.block_size_tokens),
        )
        for w in window_grid(p.min_window_steps, p.max_window_steps)
    ]


@dataclass
class _Rounds:
    """What the Pause-Resume rounds of one call did (rows of the batch)."""

    paused: list[int]
    newly_paused: list[int]
    resumed: list[int]
    stats: list[SolveStats]
    wall_s: float


@dataclass
class _Attempt:
    """The outcome of placing one set of requests."""

    rows: IntArray
    choice: IntArray | None  # candidate per row; None: infeasible
    window_steps: int
    source: PlanSource
    stats: SolveStats | None


def plan_layer_offload(
    batch: DecodeBatch,
    inputs: OffloadInputs,
    *,
    step: int = 0,
    previous: OffloadPlan | None = None,
) -> OffloadPlan:
    """The placement of `batch` for the next window; `previous` (the last
    plan for this engine) warm-starts the solver."""
    p = inputs.params
    candidates = candidate_patterns(inputs.num_layers, p.search_mode)
    warm_up()  # once per process, before the plan's clock starts
    started = time.perf_counter()
    deadline = started + p.time_limit_s
    hints = _hint_rows(previous, candidates)
    stats: list[SolveStats] = []

    def place(rows: IntArray) -> _Attempt:
        nodes_left = None
        if p.node_limit is not None:
            nodes_left = max(p.node_limit - sum(s.nodes for s in stats), MIN_SOLVE_NODES)
        attempt = _place(
            batch.subset(rows),
            rows,
            inputs,
            candidates,
            hints=hints,
            deadline=deadline,
            node_limit=nodes_left,
        )
        if attempt.stats is not None:
            stats.append(attempt.stats)
        return attempt

    arrived_paused = np.flatnonzero(batch.paused)
    active = np.flatnonzero(~batch.paused)
    newly_paused: list[int] = []
    attempt = place(active) if len(active) else None
    while attempt is not None and attempt.choice is None:
        victim = _pause_victim(batch, attempt.rows, inputs.num_layers, inputs.block_size_tokens)
        newly_paused.append(victim)
        active = active[active != victim]
        attempt = place(active) if len(active) else None
    resumed: list[int] = []
    if not newly_paused:
        for row in arrived_paused.tolist():
            trial_rows = np.sort(np.append(active, row))
            trial = place(trial_rows)
            if trial.choice is not None:
                active, attempt = trial_rows, trial
                resumed.append(row)
    rounds = _Rounds(
        paused=[int(r) for r in arrived_paused if r not in resumed] + newly_paused,
        newly_paused=newly_paused,
        resumed=resumed,
        stats=stats,
        wall_s=time.perf_counter() - started,
    )
    return _plan(batch, inputs, candidates, attempt, step=step, rounds=rounds)


def _place(
    sub: DecodeBatch,
    rows: IntArray,
    inputs: OffloadInputs,
    candidates: OffloadCandidates,
    *,
    hints: dict[str, int],
    deadline: float,
    node_limit: int | None,
) -> _Attempt:
    p = inputs.params
    windows = window_options(sub, inputs)
    blocks = end_blocks(sub, 0, inputs.block_size_tokens)
    if not _may_fit(sub, inputs, candidates, windows[0]):
        return _Attempt(rows, None, 0, PlanSource.SOLVER, None)
    greedy = greedy_choice(windows[0].end_blocks, candidates, inputs.gpu_block_budget)
    start = _start_choice(sub, hints, greedy)
    args = (inputs.layer_compute_s, inputs.link_blocks_per_s, inputs.gpu_block_budget)
    problem = offload_problem(*args, blocks, candidates, windows=windows)
    limit = max(deadline - time.perf_counter(), MIN_SOLVE_S)
    match p.backend:
        case Backend.BRANCH_AND_BOUND:
            starts = [s for s in (start, greedy) if s is not None]
            stats, choice = _solve_search(
                problem,
                limit,
                node_limit,
                p.relative_gap,
                starts,
                stagger_requests=STAGGER_REQUESTS
                if p.stagger_requests is None
                else p.stagger_requests,
                spread_moves=p.spread_moves,
            )
        case Backend.EXHAUSTIVE:
            stats, choice = _solve_exhaustive(problem, limit)
        case _:
            ilp = build_offload_ilp(*args, blocks, candidates, windows=windows)
            stats, choice = _solve_ilp(
                ilp,
                problem,
                start,
                limit=limit,
                backend=p.backend,
                options=SolveOptions(relative_gap=p.relative_gap, work_limit=p.ilp_work_limit),
            )
    if stats.status is Status.INFEASIBLE:
        return _Attempt(rows, None, 0, PlanSource.SOLVER, stats)
    if choice is not None:
        held = int(problem.evaluate(choice).held[0])
        if held > 0:
            window = windows[held - 1].steps
            return _Attempt(rows, choice, window, PlanSource.SOLVER, stats)
    # No solution in time, or the solver failed: the greedy plan.
    return _Attempt(rows, greedy, p.min_window_steps, PlanSource.GREEDY_FALLBACK, stats)


def _solve_search(
    problem: OffloadProblem,
    limit: float,
    node_limit: int | None,
    gap: float,
    starts: list[IntArray],
    *,
    stagger_requests: int,
    spread_moves: bool,
) -> tuple[SolveStats, IntArray | None]:
    r = branch_and_bound(
        problem,
        time_limit_s=limit,
        relative_gap=gap,
        starts=starts,
        node_limit=node_limit,
        stagger_requests=stagger_requests,
        spread_idle_share=SPREAD_IDLE_SHARE if spread_moves else None,
        spread_kicks=spread_moves,
    )
    stats = SolveStats(
        backend=Backend.BRANCH_AND_BOUND,
        status=r.status,
        objective=r.objective,
        best_bound=r.best_bound,
        wall_s=r.wall_time_s,
        time_limit_s=limit,
        nodes=r.nodes,
        node_limit=node_limit,
        note=f"{r.nodes} nodes; exact event-model latency, bound from the relaxed link",
    )
    return stats, r.choice


def _solve_exhaustive(problem: OffloadProblem, limit: float) -> tuple[SolveStats, IntArray | None]:
    """Every assignment (at most MAX_ENUMERATION: the work limit) until the
    time limit; stopped by it, the best plan tried, with no bound."""
    size = problem.enumeration_size()
    if size > MAX_ENUMERATION:
        raise ValueError(
            f"exhaustive search would try {size:.3g} assignments "
            f"({problem.num_choices} patterns ^ {problem.num_requests} requests); "
            f"the limit is {MAX_ENUMERATION:.3g}: use bnb or cp-sat"
        )
    started = time.perf_counter()
    deadline = started + limit
    found = problem.enumerate(stop=lambda: time.perf_counter() > deadline)
    wall = time.perf_counter() - started
    has_plan = found.choice is not None
    if found.complete:
        status = Status.OPTIMAL if has_plan else Status.INFEASIBLE
    else:
        status = Status.FEASIBLE if has_plan else Status.TIMEOUT_NO_SOLUTION
    stats = SolveStats(
        backend=Backend.EXHAUSTIVE,
        status=status,
        objective=found.latency if has_plan else None,
        best_bound=found.latency if has_plan and found.complete else None,
        wall_s=wall,
        time_limit_s=limit,
        nodes=found.tried,
        note=f"{found.tried} of {size} assignments on the exact event model"
        + ("" if found.complete else "; stopped by the time limit"),
    )
    return stats, found.choice


def _solve_ilp(
    ilp: OffloadIlp,
    problem: OffloadProblem,
    start: IntArray | None,
    *,
    limit: float,
    backend: Backend,
    options: SolveOptions,
) -> tuple[SolveStats, IntArray | None]:
    """The surrogate ILP; its plan is scored on the exact model (the ILP's
    bound is the surrogate's, not a bound on the exact latency)."""
    result = solve(
        ilp.model,
        time_limit_s=limit,
        backend=backend,
        fallback=Backend.CPSAT if backend is Backend.GUROBI else None,
        hint=_hint_values(ilp, start),
        options=options,
    )
    choice = None
    objective = None
    if result.has_solution:
        choice = np.argmax(result.value(ilp.choice), axis=1).astype(np.int64)
        value = float(problem.evaluate(choice).objective[0])
        objective = value if math.isfinite(value) else None
    note = "surrogate ILP (objective: its plan on the exact model; no exact bound)"
    stats = SolveStats(
        backend=result.backend,
        status=result.status,
        objective=objective,
        best_bound=None,
        wall_s=result.wall_time_s,
        time_limit_s=result.time_limit_s,
        note=f"{note}; {result.note}" if result.note else note,
    )
    return stats, choice


def _may_fit(
    sub: DecodeBatch, inputs: OffloadInputs, candidates: OffloadCandidates, first: WindowOption
) -> bool:
    """False when the batch is infeasible by a bound cheaper than a solve:
    memory forces at least (resident KV - budget) blocks to be fetched each
    step, the whole step's compute can hide at most sum(comp) * B of them
    (the first layer's none), and the rest stalls past the shortest window's
    latency ceiling; or not even the largest pattern for everyone fits."""
    num_layers = inputs.num_layers
    end = first.end_blocks
    most = int(candidates.count.max()) if len(candidates) else 0
    if int(end.sum()) * (num_layers - most) > inputs.gpu_block_budget:
        return False
    must_fetch = int(end.sum()) * num_layers - inputs.gpu_block_budget
    if math.isinf(first.ceiling_s) or must_fetch <= 0:
        return True
    comp = inputs.layer_compute_s
    hidden = float(comp[:-1].sum()) * inputs.link_blocks_per_s
    least_s = float(comp.sum()) + max(must_fetch - hidden, 0.0) / inputs.link_blocks_per_s
    return least_s <= first.ceiling_s * (1 + 1e-9)


def _pause_victim(batch: DecodeBatch, rows: IntArray, num_layers: int, block_size: int) -> int:
    """Pause-Resume's victim: the most KV blocks plus deposited tokens; ties
    to the later id."""
    blocks = -(-batch.num_tokens[rows] // block_size) * num_layers
    weight = blocks + batch.deposited_tokens[rows]
    best = max(range(len(rows)), key=lambda i: (int(weight[i]), batch.ids[int(rows[i])]))
    return int(rows[best])


def _hint_rows(previous: OffloadPlan | None, candidates: OffloadCandidates) -> dict[str, int]:
    """Request id -> the candidate its previous placement used."""
    if previous is None:
        return {}
    index = {tuple(np.flatnonzero(mask).tolist()): c for c, mask in enumerate(candidates.offloaded)}
    return {
        pl.id: index[pl.offloaded_layers]
        for pl in previous.placements
        if pl.offloaded_layers in index
    }


def _start_choice(
    sub: DecodeBatch, hints: dict[str, int], greedy: IntArray | None
) -> IntArray | None:
    """The warm start: each request's previous pattern, else the greedy
    plan's; None when some request has neither."""
    choice = np.zeros(len(sub), dtype=np.int64)
    for r, request_id in enumerate(sub.ids):
        c = hints.get(request_id, None if greedy is None else int(greedy[r]))
        if c is None:
            return None
        choice[r] = c
    return choice


def _hint_values(ilp: OffloadIlp, start: IntArray | None) -> FloatArray | None:
    if start is None:
        return None
    values = np.full(ilp.model.num_vars, np.nan)
    values[ilp.choice.ravel()] = 0.0
    values[ilp.choice[np.arange(len(start)), start]] = 1.0
    return values


def extend_window(
    sub: DecodeBatch,
    inputs: OffloadInputs,
    resident: npt.NDArray[np.bool_],
    start_steps: int,
) -> int:
    """The longest window >= start_steps (and within the bounds) over which
    the placement fits the budget and keeps its violations (exact model at
    the window's last step) within the cap; start_steps when even that does
    not hold (a fallback plan)."""
    p = inputs.params

    def holds(w: int) -> bool:
        blocks = end_blocks(sub, w, inputs.block_size_tokens)
        if gpu_blocks_needed(blocks, resident) > inputs.gpu_block_budget:
            return False
        latency = exact_latency_of(
            inputs.layer_compute_s, inputs.link_blocks_per_s, blocks, resident
        )
        ceiling = latency_ceiling_s(
            w, sub.deposited_tokens, sub.slo_tbt_s, p.violation_cap, sub.steps_left
        )
        return latency <= ceiling * (1 + 1e-9)

    lo, hi = start_steps, p.max_window_steps
    if lo >= hi or not holds(lo):
        return max(min(lo, hi), p.min_window_steps)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if holds(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _plan(
    batch: DecodeBatch,
    inputs: OffloadInputs,
    candidates: OffloadCandidates,
    attempt: _Attempt | None,
    *,
    step: int,
    rounds: _Rounds,
) -> OffloadPlan:
    ids = batch.ids
    comp = inputs.layer_compute_s
    bw = inputs.link_blocks_per_s
    last = rounds.stats[-1] if rounds.stats else None
    common = {
        "paused_ids": tuple(ids[r] for r in rounds.paused),
        "newly_paused_ids": tuple(ids[r] for r in rounds.newly_paused),
        "resumed_ids": tuple(ids[r] for r in rounds.resumed),
        "gpu_block_budget": inputs.gpu_block_budget,
        "solve": last,
        "solves": len(rounds.stats),
        "solve_wall_s": rounds.wall_s,
    }
    if attempt is None or attempt.choice is None:
        return OffloadPlan(
            placements=(),
            prefetch_buffer_blocks=0,
            gpu_blocks_used=0,
            gpu_blocks_used_at_expiry=0,
            predicted_step_s=float(comp.sum()) if len(ids) else 0.0,
            predicted_step_surrogate_s=float(comp.sum()) if len(ids) else 0.0,
            predicted_step_paper_s=float(comp.sum()) if len(ids) else 0.0,
            window_steps=inputs.params.min_window_steps,
            expiry_step=step + inputs.params.min_window_steps,
            violations_per_step=0.0,
            source=PlanSource.EMPTY,
            summary=f"nothing to place: {len(rounds.paused)} paused of {len(ids)}",
            **common,  # type: ignore[arg-type]
        )
    sub = batch.subset(attempt.rows)
    resident = candidates.resident[attempt.choice]
    window = extend_window(sub, inputs, resident, attempt.window_steps)
    now_blocks = end_blocks(sub, 0, inputs.block_size_tokens)
    final_blocks = end_blocks(sub, window, inputs.block_size_tokens)
    step_now = StepInputs.of(comp, now_blocks, resident, bw)
    exact = exact_latency_of(comp, bw, now_blocks, resident)
    exact_end = exact_latency_of(comp, bw, final_blocks, resident)
    surrogate = float(surrogate_latency_s(comp, now_blocks, resident, bw))
    offloaded = candidates.offloaded[attempt.choice]
    placements = tuple(
        Placement(
            id=sub.ids[i],
            distance=int(candidates.distance[c]),
            offloaded_layers=tuple(np.flatnonzero(offloaded[i]).tolist()),
            blocks_per_layer=int(now_blocks[i]),
            gpu_blocks=int(now_blocks[i] * (inputs.num_layers - candidates.count[c])),
            fetched_blocks_per_step=int(now_blocks[i] * candidates.count[c]),
        )
        for i, c in enumerate(attempt.choice.tolist())
    )
    buffer = int(prefetch_buffer_blocks(now_blocks, resident))
    used = int(gpu_blocks_needed(now_blocks, resident))
    used_end = int(gpu_blocks_needed(final_blocks, resident))
    vps = violations_per_step(
        exact_end, window, sub.deposited_tokens, sub.slo_tbt_s, sub.steps_left
    )
    source = attempt.source
    summary = (
        f"{len(placements)} placed ({sum(1 for pl in placements if pl.offloaded_layers)} "
        f"offloading), {len(rounds.paused)} paused; step {exact * 1e3:.2f} ms "
        f"(surrogate {surrogate * 1e3:.2f} ms); window {window} steps; "
        f"{used}/{inputs.gpu_block_budget} blocks"
    )
    if source is PlanSource.GREEDY_FALLBACK:
        status = str(attempt.stats.status) if attempt.stats is not None else "no solve"
        summary = f"greedy fallback (solver: {status}); " + summary
    return OffloadPlan(
        placements=placements,
        prefetch_buffer_blocks=buffer,
        gpu_blocks_used=used,
        gpu_blocks_used_at_expiry=used_end,
        predicted_step_s=exact,
        predicted_step_surrogate_s=surrogate,
        predicted_step_paper_s=paper_latency_s(step_now),
        window_steps=window,
        expiry_step=step + window,
        violations_per_step=vps,
        source=source,
        summary=summary,
        **common,  # type: ignore[arg-type]
    )
