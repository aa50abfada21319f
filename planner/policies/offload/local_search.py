"""Compiled local search on the exact step latency, for the layer-offload
search (search.py; DESIGN.md §3.2).

An assignment gives each request one pattern. Its objective is problem.py's:
the exact event-model latency (step_kernels.step_latency), ties to the
longer window, then fewer blocks fetched; it is feasible when the shortest
window's memory and SLO rows hold. The search keeps the blocks fetched per
layer (the prefetch buffer is their maximum) and the memory rows' sums of
the current assignment and updates them per move, so a move costs one
simulation of the step, stopped as soon as the step must end later than the
assignment it has to beat.

A move is *down* when it offloads less (uses more memory) and *up* when it
offloads more; it is *narrow* when it changes the pattern by at most
NARROW_STEPS or drops to none.

- fill: from an assignment whose memory row does not hold, up moves (narrow
  ones, and for each request the least pattern that frees the whole excess
  alone) taken greedily, the least increase of the exact latency per block
  of excess freed first, until the row holds. Lazily: a move's score is
  recomputed only when it comes to the front, and taken when it is still
  within FILL_TOLERANCE of the others' (older) scores, since other moves
  rarely make a move cheaper. From nothing offloaded it is a start of its
  own.
- descend: from a feasible assignment, rounds of narrow moves:
  1. down moves that keep the memory row: the best that improves is taken.
     The others that would shorten the step are the *gainers*;
  2. up moves: their changes of latency (the *partners*); one that improves
     on its own is taken;
  3. pairs of a gainer and a partner of another request that frees at
     least the gainer's excess, least summed change first, the first that
     improves taken;
  4. compounds: a gainer, then partners on their changes as computed (one
     simulation); then a gainer and fill (a few of the gainers of most
     gain);
  5. stagger moves (only when asked, `stagger` > 0; tried before step 3
     in each round): the link idles in a layer's compute when every fetch
     released so far is done, because the requests that offload that layer
     release their next fetch only at its end (aligned fetch chains, e.g.
     large requests that all offload every second layer). The `stagger`
     requests that hold the link back most (idle time of the layers they
     offload times their blocks) move to any other pattern, the memory row
     repaired by the partners greedily or by one of the STAGGER_PARTNERS
     requests whose least covering pattern adds the fewest blocks; the best
     of a request's moves taken when it improves;
  until nothing improves (a local optimum) or the work runs out. The
  gainers' and partners' changes are kept from round to round (a request's
  own recomputed once it moves); a round that finds nothing is repeated with
  all of them recomputed before the search counts as converged.
- improve: descend, then kicks while the work lasts, each from the best
  assignment: one offloading request (or two) drops to fewer patterns and
  fill repairs the memory row, or a request takes one to three patterns
  more, or (spread kicks, when asked) the largest offloading request drops
  to nothing and the smallest requests that offload nothing, smallest
  first, take one of the three largest patterns until the memory row holds
  (the best plans fetch from many small requests); then descend; the result
  replaces the best when it is better. The kicks' choices come from a fixed
  pseudo-random sequence.
- stall_greedy: a start that minds the stall on the linear surrogate: from
  nothing offloaded, while the shortest window's memory row does not hold,
  the single move that adds the least surrogate stall per block it frees;
  the first single move that makes the surrogate's rows hold ends it.

Work is counted in simulations (one node each): the entry points take
(p, work, deadline, ...), `work` = new_work(limit) = [simulations, limit,
stopped]; the same count stops the search at the same point on any machine.
The clock (`deadline`, time.perf_counter seconds) is read every CLOCK_EVERY
simulations.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from planner.policies.offload.problem import LATENCY_RTOL, SLO_RTOL, OffloadProblem
from planner.policies.offload.step_kernels import (
    COMPILED,
    jit,
    jit_with_gil,
    remaining_compute,
    step_latency,
    step_scratch,
)

CLOCK_EVERY = 16
# Narrow moves change a request's pattern by at most this many (or to none).
NARROW_STEPS = 2
# Pairs: the gainers and partners kept (least change of latency first), and
# the pairs simulated per round.
MAX_GAINERS = 24
MAX_PARTNERS = 96
MAX_PAIRS = 64
# Compounds tried per round (the gainers of most gain first).
MAX_COMPOUNDS = 1
# Stagger moves: the requests tried per round, those whose fetch chains
# leave the link idle the longest first (0: no stagger moves).
STAGGER_REQUESTS = 2
# The requests tried as a stagger move's single partner when it breaks the
# memory row.
STAGGER_PARTNERS = 4
# fill's score of a move: (latency increase + FILL_VOLUME_WEIGHT * the
# blocks it adds / B) per block of excess it frees: among moves that hide
# their fetches, the one that moves fewer blocks.
FILL_VOLUME_WEIGHT = 0.1
UNSCORED, SEEDED, NOT_CANDIDATE = -1, -2, -3
# The kicks' pseudo-random sequence starts here (the same kicks on any
# machine).
KICK_SEED = 0x9E3779B97F4A7C15
# fill takes a rescored move when its score is within this fraction of the
# least stale score of the others.
FILL_TOLERANCE = 0.1
# descend's and improve's tally: simulations per phase, then improvements
# per kind of move.
TALLY = (
    "rounds",
    "down_sims",
    "gainer_sims",
    "up_sims",
    "pair_sims",
    "fill_sims",
    "down_moves",
    "up_moves",
    "pair_moves",
    "compound_moves",
    "kicks",
    "kick_improvements",
    "stagger_sims",
    "stagger_moves",
    "spread_improvements",  # search.py's descent from its spread start won
)

if COMPILED:
    import numba

    def _clock() -> float:
        with numba.objmode(t="float64"):
            t = time.perf_counter()
        return t

    now_s = jit_with_gil(_clock)
else:  # pragma: no cover - numba is a dependency
    now_s = time.perf_counter


def packed(problem: OffloadProblem) -> tuple[Any, ...]:
    """The problem as the kernels take it (p[0] ... p[14])."""
    return (
        problem.comp_s,
        remaining_compute(problem.comp_s),
        problem.bandwidth_blocks_per_s,
        problem.blocks,
        problem.blocks_f,
        problem.layers_of,
        problem.count,
        problem.fetched,
        problem.mem_coef,
        problem.mem_cap,
        problem.slo_coef_f,
        problem.slo_cap_s,
        SLO_RTOL,
        LATENCY_RTOL,
        problem.window_weight,
    )


def new_work(max_evals: int) -> Any:
    """[simulations, limit, stopped]."""
    return np.array([0, max_evals, 0], dtype=np.int64)


@jit
def _tick(work: Any, deadline: float) -> bool:
    """Count one simulation; True once the work is spent."""
    work[0] += 1
    if work[2] == 0 and (work[0] >= work[1] or (work[0] % CLOCK_EVERY == 0 and now_s() > deadline)):
        work[2] = 1
    return bool(work[2] != 0)


@jit
def _better(objective: float, tiebreak: float, than: float, than_tie: float, rtol: float) -> bool:
    """problem.better: (objective, tiebreak) strictly before (than, than_tie)."""
    if not np.isfinite(objective):
        return False
    if not np.isfinite(than):
        return True
    if objective < than * (1 - rtol):
        return True
    if objective > than * (1 + rtol):
        return False
    return tiebreak < than_tie


@jit
def _move(p: Any, choice: Any, layer_blocks: Any, mem: Any, r: int, new: int) -> None:  # noqa: PLR0917
    """Request r to pattern new, in the blocks fetched per layer and the
    memory rows' sums too."""
    blocks, layers_of, count, mem_coef = p[3], p[5], p[6], p[8]
    old = choice[r]
    b = blocks[r]
    for j in range(count[old]):
        layer_blocks[layers_of[old, j]] -= b
    for j in range(count[new]):
        layer_blocks[layers_of[new, j]] += b
    for w in range(mem.shape[0]):
        mem[w] += mem_coef[w, r, new] - mem_coef[w, r, old]
    choice[r] = new


@jit
def _largest(values: Any) -> int:
    most = 0
    for v in values:
        most = max(most, v)
    return most


@jit
def _excess(p: Any, layer_blocks: Any, mem: Any) -> int:
    """The shortest window's memory row: used minus available blocks."""
    return int(mem[0] + _largest(layer_blocks) - p[9][0])


@jit
def _memory_held(p: Any, layer_blocks: Any, mem: Any) -> int:
    """Window options (a prefix) whose memory row holds."""
    mem_cap = p[9]
    buffer = _largest(layer_blocks)
    held = 0
    for w in range(mem.shape[0]):
        if mem[w] + buffer > mem_cap[w]:
            break
        held = w + 1
    return held


@jit
def _slo_blocks(p: Any, choice: Any, w: int) -> float:
    slo_coef = p[10]
    slo = 0.0
    for r in range(choice.shape[0]):
        slo += slo_coef[w, r, choice[r]]
    return slo


@jit
def _fetched(p: Any, choice: Any) -> int:
    fetched = p[7]
    total = 0
    for r in range(choice.shape[0]):
        total += fetched[r, choice[r]]
    return total


@jit
def _held(p: Any, choice: Any, latency: float, memory_held: int) -> int:
    """Window options held: memory (memory_held of them) and SLO rows, as
    problem.evaluate counts them."""
    bandwidth, slo_cap_s, slo_rtol = p[2], p[11], p[12]
    held = 0
    for w in range(memory_held):
        if latency + _slo_blocks(p, choice, w) / bandwidth > slo_cap_s[w] * (1 + slo_rtol):
            break
        held = w + 1
    return held


@jit
def _latency(p: Any, choice: Any, limit: float, scratch: Any) -> float:
    return step_latency(p[0], p[1], p[2], p[4], p[5], p[6], choice, limit, scratch)


@jit
def _score(  # noqa: PLR0917
    p: Any,
    choice: Any,
    layer_blocks: Any,
    mem: Any,
    best: float,
    best_tie: float,
    scratch: Any,
) -> tuple[float, float, bool]:
    """(latency, tiebreak, simulated) of choice when it is feasible and
    beats (best, best_tie); (inf, inf, simulated) otherwise."""
    bandwidth, slo_cap_s, slo_rtol, rtol, window_weight = p[2], p[11], p[12], p[13], p[14]
    num_w = mem.shape[0]
    memory_held = _memory_held(p, layer_blocks, mem)
    if memory_held == 0:
        return np.inf, np.inf, False
    fetched = _fetched(p, choice)
    tie_floor = window_weight * (num_w - memory_held) + fetched
    if not np.isfinite(best):
        limit = np.inf
    elif tie_floor < best_tie:
        limit = best * (1 + rtol)
    else:
        limit = best * (1 - rtol)
    slo_limit = slo_cap_s[0] * (1 + slo_rtol) - _slo_blocks(p, choice, 0) / bandwidth
    limit = min(limit, slo_limit)
    latency = _latency(p, choice, limit, scratch)
    if not np.isfinite(latency):
        return np.inf, np.inf, True
    held = _held(p, choice, latency, memory_held)
    if held == 0:
        return np.inf, np.inf, True
    tie = float(window_weight * (num_w - held) + fetched)
    if not _better(latency, tie, best, best_tie, rtol):
        return np.inf, np.inf, True
    return latency, tie, True


@jit
def _state(p: Any, choice: Any) -> tuple[Any, Any]:
    """(blocks fetched per layer, memory rows' sums) of choice."""
    blocks, layers_of, count, mem_coef = p[3], p[5], p[6], p[8]
    layer_blocks = np.zeros(p[0].shape[0], np.int64)
    mem = np.zeros(mem_coef.shape[0], np.int64)
    for r in range(choice.shape[0]):
        c = choice[r]
        for j in range(count[c]):
            layer_blocks[layers_of[c, j]] += blocks[r]
        for w in range(mem.shape[0]):
            mem[w] += mem_coef[w, r, c]
    return layer_blocks, mem


@jit
def evaluate_one(p: Any, choice: Any) -> tuple[float, float]:
    """(latency, tiebreak) of a feasible choice, (inf, inf) otherwise."""
    layer_blocks, mem = _state(p, choice)
    scratch = step_scratch(choice.shape[0], p[0].shape[0])
    latency, tie, _ = _score(p, choice, layer_blocks, mem, np.inf, np.inf, scratch)
    return latency, tie


@jit
def _fill(  # noqa: PLR0917
    p: Any,
    choice: Any,
    layer_blocks: Any,
    mem: Any,
    frozen: int,
    seeds: Any,
    work: Any,
    deadline: float,
    scratch: Any,
) -> bool:
    """Up moves (not of request `frozen`) until the memory row holds (see
    the module's docstring); False when it cannot or the work ran out. A
    request's candidates: up to NARROW_STEPS patterns up, and the least pattern
    that frees the whole excess on its own. seeds (request, pattern, change
    of latency) rows, when any: the candidates' changes of latency from
    before (descend's partners); the others are not candidates until their
    request moves."""
    mem_coef, fetched, bandwidth = p[8], p[7], p[2]
    num_r = choice.shape[0]
    num_c = p[6].shape[0]
    excess = _excess(p, layer_blocks, mem)
    if excess <= 0:
        return True
    score = np.zeros((num_r, num_c))
    # The step each score is of; UNSCORED: to score now; SEEDED: from seeds;
    # NOT_CANDIDATE: left out.
    stamp = np.full((num_r, num_c), UNSCORED, np.int64)
    if len(seeds):
        stamp[:, :] = NOT_CANDIDATE
        for i in range(len(seeds)):
            s, c = int(seeds[i, 0]), int(seeds[i, 1])
            old = choice[s]
            freed = mem_coef[0, s, old] - mem_coef[0, s, c]
            if freed > 0:
                added = fetched[s, c] - fetched[s, old]
                cost = max(seeds[i, 2], 0.0) + FILL_VOLUME_WEIGHT * added / bandwidth
                score[s, c] = cost / min(freed, excess)
                stamp[s, c] = SEEDED
    latency_of = np.zeros((num_r, num_c))  # the latency a scored move gives
    here = _latency(p, choice, np.inf, scratch)
    if _tick(work, deadline):
        return False
    step = 0
    while True:
        # The front runner (never scored first, then the least score) and
        # the runner-up's key.
        front_s, front_c, front, runner = -1, -1, np.inf, np.inf
        for s in range(num_r):
            if s == frozen:
                continue
            old = choice[s]
            for c in range(old + 1, num_c):
                covers = mem_coef[0, s, old] - mem_coef[0, s, c] >= excess
                if c <= old + NARROW_STEPS or covers:
                    key = score[s, c]
                    if stamp[s, c] == UNSCORED:
                        key = -np.inf
                    elif stamp[s, c] == NOT_CANDIDATE:
                        key = np.inf
                    if front_s < 0 or key < front:
                        runner = min(runner, front)
                        front_s, front_c, front = s, c, key
                    else:
                        runner = min(runner, key)
                if covers:
                    break
        if front_s < 0:
            return False
        if front == np.inf:
            # No move frees any of the excess on its own (each adds as much
            # to the prefetch buffer): the one that frees the most before the
            # buffer, to go on from.
            front_s, front_c = _most_freeing(p, choice, frozen, excess)
            if front_s < 0:
                return False
            _move(p, choice, layer_blocks, mem, front_s, front_c)
            excess = _excess(p, layer_blocks, mem)
            if excess <= 0:
                return True
            here = _latency(p, choice, np.inf, scratch)
            if _tick(work, deadline):
                return False
            step += 1
            stamp[front_s, :] = UNSCORED
            continue
        if stamp[front_s, front_c] != step:
            old = choice[front_s]
            added = fetched[front_s, front_c] - fetched[front_s, old]
            _move(p, choice, layer_blocks, mem, front_s, front_c)
            freed = excess - _excess(p, layer_blocks, mem)
            latency = np.inf
            if freed > 0:
                latency = _latency(p, choice, np.inf, scratch)
            _move(p, choice, layer_blocks, mem, front_s, old)
            stamp[front_s, front_c] = step
            score[front_s, front_c] = np.inf
            latency_of[front_s, front_c] = latency
            if freed > 0:
                cost = max(latency - here, 0.0) + FILL_VOLUME_WEIGHT * added / bandwidth
                score[front_s, front_c] = cost / min(freed, excess)
                if _tick(work, deadline):
                    return False
            # Stale scores rarely fall: take it unless another's (stale) is
            # clearly lower.
            if not score[front_s, front_c] <= runner * (1 + FILL_TOLERANCE):
                continue
        _move(p, choice, layer_blocks, mem, front_s, front_c)
        excess = _excess(p, layer_blocks, mem)
        if excess <= 0:
            return True
        here = latency_of[front_s, front_c]
        step += 1
        # Its moves now start from another pattern.
        stamp[front_s, :] = UNSCORED


@jit
def _most_freeing(p: Any, choice: Any, frozen: int, excess: int) -> tuple[int, int]:
    """Among fill's candidates, the move that frees the most memory before
    the prefetch buffer; (-1, -1) when none frees any."""
    mem_coef = p[8]
    most, best_s, best_c = 0, -1, -1
    for s in range(choice.shape[0]):
        if s == frozen:
            continue
        old = choice[s]
        for c in range(old + 1, p[6].shape[0]):
            freed = mem_coef[0, s, old] - mem_coef[0, s, c]
            if (c <= old + NARROW_STEPS or freed >= excess) and freed > most:
                most, best_s, best_c = freed, s, c
            if freed >= excess:
                break
    return best_s, best_c


@jit
def idle_share(p: Any, work: Any, deadline: float, choice: Any) -> float:
    """The share of a feasible choice's step in which the link idles while
    blocks are still to be moved (one simulation)."""
    scratch = step_scratch(choice.shape[0], p[0].shape[0])
    latency = step_latency(p[0], p[1], p[2], p[4], p[5], p[6], choice, np.inf, scratch)
    _tick(work, deadline)
    if not latency > 0:
        return 0.0
    return float(scratch[7].sum()) / latency


@jit
def fill_from_nothing(p: Any, work: Any, deadline: float) -> Any:
    """fill's start: from nothing offloaded (choice; feasible or not)."""
    num_r = p[3].shape[0]
    choice = np.zeros(num_r, np.int64)
    layer_blocks, mem = _state(p, choice)
    scratch = step_scratch(num_r, p[0].shape[0])
    _fill(
        p,
        choice,
        layer_blocks,
        mem,
        -1,
        np.zeros((0, 3)),
        work,
        deadline,
        scratch,
    )
    return choice


@jit
def _narrow(old: int, c: int) -> bool:
    """Within NARROW_STEPS patterns of old, or to none."""
    return c == 0 or abs(c - old) <= NARROW_STEPS


@jit
def descend(  # noqa: PLR0917
    p: Any,
    choice: Any,
    best: float,
    best_tie: float,
    work: Any,
    deadline: float,
    tally: Any,
    stagger: int,
) -> tuple[float, float, bool]:
    """Local search from a feasible choice of objective (best, best_tie),
    improved in place: (latency, tiebreak, converged: no narrow move
    improves, nor a stagger move of the `stagger` requests that idle the
    link longest).

    The gainers' and partners' changes of latency are kept between rounds
    (a request's own are recomputed once it moves): pairs and compounds are
    simulated anyway, so stale changes only order them. A round that finds
    nothing with stale changes is repeated with all of them recomputed
    before the search counts as converged."""
    num_r = choice.shape[0]
    num_c = p[6].shape[0]
    rtol = p[13]
    scratch = step_scratch(num_r, p[0].shape[0])
    layer_blocks, mem = _state(p, choice)
    change = np.zeros((num_r, num_c))  # latency change of a gainer or partner move
    stamp = np.full((num_r, num_c), -1, np.int64)  # the version it is of; -1: none
    row_of = choice.copy()  # each request's pattern when its row was computed
    version = 0  # moves taken so far
    moves = num_r * num_c
    gain_r = np.empty(moves, np.int64)
    gain_c = np.empty(moves, np.int64)
    gain_d = np.empty(moves)
    gain_x = np.empty(moves, np.int64)  # the memory row's excess after the move
    part_r = np.empty(moves, np.int64)
    part_c = np.empty(moves, np.int64)
    part_d = np.empty(moves)
    part_x = np.empty(moves, np.int64)
    undo = choice.copy()
    order = np.empty(0, np.int64)
    gainers = 0
    partners = 0
    refresh = False
    while True:
        tally[0] += 1
        for r in range(num_r):
            if choice[r] != row_of[r]:
                stamp[r, :] = -1
                row_of[r] = choice[r]
        stale = False
        # 1. Down moves that keep the memory row, the best that improves
        # taken; the others that would shorten the step are the gainers.
        # 2. Up moves: their changes of latency, kept (the partners) when
        # within the largest gain; one that improves on its own is taken.
        moved = False
        for phase in range(2):
            down = phase == 0
            if down:
                limit, keep_below = best * (1 - rtol), -rtol * best
            else:
                order = np.argsort(gain_d[:gainers], kind="mergesort")[:MAX_GAINERS]
                keep_below = -gain_d[order[0]] if gainers else 0.0
                limit = max(best + keep_below, best * (1 + rtol))
            round_best, round_tie, move_r, move_c, listed, stale_here, stopped = _scan(
                p,
                choice,
                layer_blocks,
                mem,
                best,
                best_tie,
                down,
                limit,
                keep_below,
                refresh,
                version,
                change,
                stamp,
                gain_r if down else part_r,
                gain_c if down else part_c,
                gain_d if down else part_d,
                gain_x if down else part_x,
                work,
                deadline,
                scratch,
                tally,
            )
            stale = stale or stale_here
            if down:
                gainers = listed
            else:
                partners = listed
            if move_r >= 0:
                _move(p, choice, layer_blocks, mem, move_r, move_c)
            if stopped:
                if move_r >= 0:
                    return round_best, round_tie, False
                return best, best_tie, False
            if move_r >= 0:
                best, best_tie = round_best, round_tie
                version += 1
                refresh = False
                tally[6 + phase] += 1
                moved = True
                break
        if moved:
            continue
        improved = _pairs_stagger_compounds(
            p,
            choice,
            layer_blocks,
            mem,
            best,
            best_tie,
            stagger,
            order,
            gain_r,
            gain_c,
            gain_d,
            gain_x,
            part_r[:partners],
            part_c[:partners],
            part_d[:partners],
            undo,
            work,
            deadline,
            scratch,
            tally,
        )
        if work[2] and not improved:
            return best, best_tie, False
        if improved:
            best, best_tie = evaluate_one(p, choice)
            version += 1
            refresh = False
            if work[2]:
                return best, best_tie, False
            continue
        if stale and not refresh:
            refresh = True
            continue
        return best, best_tie, True


@jit
def _scan(  # noqa: PLR0917
    p: Any,
    choice: Any,
    layer_blocks: Any,
    mem: Any,
    best: float,
    best_tie: float,
    down: bool,
    limit: float,
    keep_below: float,
    refresh: bool,
    version: int,
    change: Any,
    stamp: Any,
    out_r: Any,
    out_c: Any,
    out_d: Any,
    out_x: Any,
    work: Any,
    deadline: float,
    scratch: Any,
    tally: Any,
) -> tuple[float, float, int, int, int, bool, bool]:
    """descend's scan of the narrow moves of one direction (down: offload
    less; up: offload more) from choice (of objective best, best_tie).

    A down move that keeps the memory row is scored in full; any other move
    gets its change of latency (simulated up to `limit`, or kept from an
    earlier version of choice unless `refresh`), and an up move whose
    latency does not grow is then scored in full. The best move scored that
    improves is returned, not taken. The moves whose change is below
    keep_below are listed in out_r, out_c, out_d (the change) and out_x (the
    memory row's excess after a down move; 0 after an up move).

    Returns (latency, tiebreak, r, c of the best move (-1, -1: none),
    moves listed, stale: a change kept from an earlier version was listed
    or passed over, stopped: the work ran out)."""
    mem_coef, rtol = p[8], p[13]
    num_r = choice.shape[0]
    num_c = p[6].shape[0]
    round_best, round_tie, move_r, move_c = best, best_tie, -1, -1
    listed = 0
    stale = False
    for r in range(num_r):
        old = choice[r]
        for c in range(num_c):
            grows = mem_coef[0, r, c] - mem_coef[0, r, old]
            if grows == 0 or (grows > 0) != down or not _narrow(old, c):
                continue
            _move(p, choice, layer_blocks, mem, r, c)
            simulated = False
            if down and _memory_held(p, layer_blocks, mem) > 0:
                lat, tie, simulated = _score(
                    p, choice, layer_blocks, mem, round_best, round_tie, scratch
                )
                tally[1] += simulated
                if np.isfinite(lat):
                    round_best, round_tie, move_r, move_c = lat, tie, r, c
            else:
                excess = _excess(p, layer_blocks, mem) if down else 0
                if stamp[r, c] < 0 or (refresh and stamp[r, c] != version):
                    lat = _latency(p, choice, limit, scratch)
                    change[r, c] = lat - best
                    stamp[r, c] = version
                    simulated = True
                    tally[2 if down else 3] += 1
                    if not down and lat <= best * (1 + rtol):
                        alone, alone_tie, _ = _score(
                            p, choice, layer_blocks, mem, round_best, round_tie, scratch
                        )
                        if np.isfinite(alone):
                            round_best, round_tie, move_r, move_c = alone, alone_tie, r, c
                elif stamp[r, c] != version:
                    stale = True
                if change[r, c] < keep_below:
                    out_r[listed], out_c[listed], out_d[listed] = r, c, change[r, c]
                    out_x[listed] = excess
                    listed += 1
            _move(p, choice, layer_blocks, mem, r, old)
            if simulated and _tick(work, deadline):
                return round_best, round_tie, move_r, move_c, listed, stale, True
    return round_best, round_tie, move_r, move_c, listed, stale, False


@jit
def _pairs_stagger_compounds(  # noqa: PLR0917
    p: Any,
    choice: Any,
    layer_blocks: Any,
    mem: Any,
    best: float,
    best_tie: float,
    stagger: int,
    order: Any,
    gain_r: Any,
    gain_c: Any,
    gain_d: Any,
    gain_x: Any,
    part_r: Any,
    part_c: Any,
    part_d: Any,
    undo: Any,
    work: Any,
    deadline: float,
    scratch: Any,
    tally: Any,
) -> bool:
    """descend's steps 5 (when `stagger` > 0), 3 and 4, in that order: True
    when a move was taken (in place). order: the gainers to pair (none: no
    pairs nor compounds)."""
    if stagger > 0:
        if _stagger(
            p,
            choice,
            layer_blocks,
            mem,
            best,
            best_tie,
            stagger,
            part_r,
            part_c,
            part_d,
            undo,
            work,
            deadline,
            scratch,
            tally,
        ):
            return True
        if work[2]:
            return False
    if len(order) == 0 or len(part_r) == 0:
        return False
    mem_coef = p[8]
    # 3. Pairs: a gainer and a partner that frees at least its excess (its
    # buffer only grows), least summed change first.
    kept = np.argsort(part_d, kind="mergesort")[:MAX_PARTNERS]
    proxy = np.empty(len(order) * len(kept))
    for i in range(len(order)):
        for j in range(len(kept)):
            g, q = order[i], kept[j]
            s = part_r[q]
            freed = mem_coef[0, s, choice[s]] - mem_coef[0, s, part_c[q]]
            useless = gain_r[g] == s or freed < gain_x[g]
            proxy[i * len(kept) + j] = np.inf if useless else gain_d[g] + part_d[q]
    ranked = np.argsort(proxy, kind="mergesort")
    tried = 0
    for k in ranked:
        if not proxy[k] < 0 or tried >= MAX_PAIRS:
            break
        g, q = order[k // len(kept)], kept[k % len(kept)]
        r, s = gain_r[g], part_r[q]
        old_r, old_s = choice[r], choice[s]
        _move(p, choice, layer_blocks, mem, r, gain_c[g])
        _move(p, choice, layer_blocks, mem, s, part_c[q])
        lat, _, simulated = _score(p, choice, layer_blocks, mem, best, best_tie, scratch)
        tally[4] += simulated
        tried += simulated
        if np.isfinite(lat):
            tally[8] += 1
            return True
        _move(p, choice, layer_blocks, mem, s, old_s)
        _move(p, choice, layer_blocks, mem, r, old_r)
        if simulated and _tick(work, deadline):
            return False
    # 4. Compounds: a gainer, then partners taken greedily on their changes
    # of latency as they are (no simulation until the last); then a gainer
    # and fill (simulating as it goes, from the partners' changes).
    for i in range(len(order)):
        g = order[i]
        undo[:] = choice
        _move(p, choice, layer_blocks, mem, gain_r[g], gain_c[g])
        if _greedy_partners(p, choice, layer_blocks, mem, gain_r[g], part_r, part_c, part_d):
            lat, _, simulated = _score(p, choice, layer_blocks, mem, best, best_tie, scratch)
            tally[5] += simulated
            if np.isfinite(lat):
                tally[9] += 1
                return True
            if simulated and _tick(work, deadline):
                _undo(p, choice, layer_blocks, mem, undo)
                return False
        _undo(p, choice, layer_blocks, mem, undo)
    seeds = np.empty((len(part_r), 3))
    for q in range(len(part_r)):
        seeds[q, 0], seeds[q, 1], seeds[q, 2] = part_r[q], part_c[q], part_d[q]
    for i in range(min(len(order), MAX_COMPOUNDS)):
        g = order[i]
        undo[:] = choice
        _move(p, choice, layer_blocks, mem, gain_r[g], gain_c[g])
        before = work[0]
        filled = _fill(p, choice, layer_blocks, mem, gain_r[g], seeds, work, deadline, scratch)
        tally[5] += work[0] - before
        if filled:
            lat, _, simulated = _score(p, choice, layer_blocks, mem, best, best_tie, scratch)
            if np.isfinite(lat):
                tally[9] += 1
                return True
            if simulated:
                _tick(work, deadline)
        _undo(p, choice, layer_blocks, mem, undo)
        if work[2]:
            return False
    return False


@jit
def _stagger(  # noqa: PLR0917
    p: Any,
    choice: Any,
    layer_blocks: Any,
    mem: Any,
    best: float,
    best_tie: float,
    requests: int,
    part_r: Any,
    part_c: Any,
    part_d: Any,
    undo: Any,
    work: Any,
    deadline: float,
    scratch: Any,
    tally: Any,
) -> bool:
    """descend's step 5, stagger moves: True when one was taken (in place).

    The link idles in a layer's compute when every fetch released so far is
    done; the requests that offload that layer (and a later one) release
    their next fetch only at its end, so their chains hold the link back. The
    `requests` requests that offload the layers of most idle time move to
    any other pattern (a distance out of phase with the others'), partners
    taken greedily on their changes of latency (as in the compounds), or
    one of the STAGGER_PARTNERS requests whose least pattern that frees the
    excess alone adds the fewest blocks, when the memory row breaks. The
    best of a request's moves is taken when it improves (else the next
    request's are tried)."""
    blocks, layers_of, count = p[3], p[5], p[6]
    num_r = choice.shape[0]
    num_c = count.shape[0]
    _latency(p, choice, np.inf, scratch)
    tally[12] += 1
    if _tick(work, deadline):
        return False
    idle = scratch[7]
    held_back = np.zeros(num_r)
    for r in range(num_r):
        c = choice[r]
        for j in range(count[c] - 1):
            held_back[r] += idle[layers_of[c, j]] * blocks[r]
    ranked = np.argsort(-held_back, kind="mergesort")
    round_best, round_tie = best, best_tie
    kept = choice.copy()
    for i in range(min(requests, num_r)):
        r = ranked[i]
        if not held_back[r] > 0:
            break
        old = choice[r]
        for c in range(num_c):
            if c == old:
                continue
            undo[:] = choice
            _move(p, choice, layer_blocks, mem, r, c)
            excess = _excess(p, layer_blocks, mem)
            # Repairs: none needed; the partners greedily; each of the
            # STAGGER_PARTNERS requests whose least pattern that frees the
            # whole excess alone adds the fewest blocks.
            tries = 1 if excess <= 0 else 1 + STAGGER_PARTNERS
            covering_s, covering_c = _covering(p, choice, r, excess, STAGGER_PARTNERS)
            for t in range(tries):
                if t == 1 and not _greedy_partners(
                    p, choice, layer_blocks, mem, r, part_r, part_c, part_d
                ):
                    continue
                if t > 1:
                    if covering_s[t - 2] < 0:
                        break
                    _move(p, choice, layer_blocks, mem, covering_s[t - 2], covering_c[t - 2])
                lat, tie, simulated = _score(
                    p, choice, layer_blocks, mem, round_best, round_tie, scratch
                )
                tally[12] += simulated
                if np.isfinite(lat):
                    round_best, round_tie = lat, tie
                    kept[:] = choice
                if t > 0:
                    _undo(p, choice, layer_blocks, mem, undo)
                    _move(p, choice, layer_blocks, mem, r, c)
                if simulated and _tick(work, deadline):
                    _undo(p, choice, layer_blocks, mem, undo)
                    return False
            _undo(p, choice, layer_blocks, mem, undo)
        if round_best < best or round_tie < best_tie:
            _undo(p, choice, layer_blocks, mem, kept)
            tally[13] += 1
            return True
    return False


@jit
def _covering(p: Any, choice: Any, frozen: int, excess: int, most: int) -> tuple[Any, Any]:
    """Up to `most` requests (not `frozen`) whose least pattern that frees
    `excess` blocks of memory alone adds the fewest blocks fetched, with
    that pattern; -1 past the last."""
    mem_coef, fetched = p[8], p[7]
    num_r = choice.shape[0]
    num_c = p[6].shape[0]
    added = np.full(num_r, np.inf)
    pattern = np.full(num_r, -1, np.int64)
    for s in range(num_r):
        if s == frozen or excess <= 0:
            continue
        old = choice[s]
        for c in range(old + 1, num_c):
            if mem_coef[0, s, old] - mem_coef[0, s, c] >= excess:
                added[s] = fetched[s, c] - fetched[s, old]
                pattern[s] = c
                break
    ranked = np.argsort(added, kind="mergesort")
    out_s = np.full(most, -1, np.int64)
    out_c = np.full(most, -1, np.int64)
    for i in range(min(most, num_r)):
        s = ranked[i]
        if pattern[s] >= 0:
            out_s[i], out_c[i] = s, pattern[s]
    return out_s, out_c


@jit
def _undo(p: Any, choice: Any, layer_blocks: Any, mem: Any, saved: Any) -> None:
    for r in range(choice.shape[0]):
        if choice[r] != saved[r]:
            _move(p, choice, layer_blocks, mem, r, saved[r])


@jit
def _greedy_partners(  # noqa: PLR0917
    p: Any,
    choice: Any,
    layer_blocks: Any,
    mem: Any,
    frozen: int,
    part_r: Any,
    part_c: Any,
    part_d: Any,
) -> bool:
    """Partner moves (one per request, not `frozen`'s) with the least change
    of latency, as computed before, per block of excess freed, until the
    memory row holds; True when it does."""
    mem_coef, fetched, bandwidth = p[8], p[7], p[2]
    moved = np.zeros(choice.shape[0], np.bool_)
    moved[frozen] = True
    excess = _excess(p, layer_blocks, mem)
    while excess > 0:
        best_score, best_q = np.inf, -1
        for q in range(len(part_r)):
            s = part_r[q]
            if moved[s]:
                continue
            freed = mem_coef[0, s, choice[s]] - mem_coef[0, s, part_c[q]]
            if freed <= 0:
                continue
            added = fetched[s, part_c[q]] - fetched[s, choice[s]]
            cost = max(part_d[q], 0.0) + FILL_VOLUME_WEIGHT * added / bandwidth
            score = cost / min(freed, excess)
            if score < best_score:
                best_score, best_q = score, q
        if best_q < 0:
            return False
        s = part_r[best_q]
        moved[s] = True
        _move(p, choice, layer_blocks, mem, s, part_c[best_q])
        excess = _excess(p, layer_blocks, mem)
    return True


@jit
def improve(  # noqa: PLR0917
    p: Any,
    work: Any,
    deadline: float,
    choice: Any,
    kicks: int,
    tally: Any,
    stagger: int,
    descended: bool,
    spread_kicks: bool,
) -> tuple[float, float, bool]:
    """descend (unless `descended`: choice is a local optimum already), then
    up to `kicks` kicks (see the module's docstring), from a feasible choice
    (improved in place): (latency, tiebreak, finished: the descent converged
    and the kicks ran out before the work did)."""
    num_r = choice.shape[0]
    num_c = p[6].shape[0]
    best, best_tie = evaluate_one(p, choice)
    if not np.isfinite(best):
        return best, best_tie, True
    if not descended:
        best, best_tie, converged = descend(
            p, choice, best, best_tie, work, deadline, tally, stagger
        )
        if not converged:
            return best, best_tie, False
    scratch = step_scratch(num_r, p[0].shape[0])
    trial = choice.copy()
    rng = np.array([KICK_SEED], np.uint64)
    offloading = np.empty(num_r, np.int64)
    no_seeds = np.zeros((0, 3))
    smallest_first = np.argsort(p[3], kind="mergesort")
    kinds = 4 if spread_kicks else 3
    for _ in range(kicks):
        tally[10] += 1
        trial[:] = choice
        layer_blocks, mem = _state(p, trial)
        n = 0
        for r in range(num_r):
            if trial[r] > 0:
                offloading[n] = r
                n += 1
        kind = _draw(rng, kinds)
        if kind == 3 and n > 0:
            # The largest offloading request to nothing; the smallest
            # requests that offload nothing, smallest first, each to one of
            # the three largest patterns, until the memory row holds.
            big = offloading[0]
            for i in range(n):
                if p[3][offloading[i]] > p[3][big]:
                    big = offloading[i]
            _move(p, trial, layer_blocks, mem, big, 0)
            for i in range(num_r):
                if _excess(p, layer_blocks, mem) <= 0:
                    break
                r = smallest_first[i]
                if r != big and trial[r] == 0:
                    _move(p, trial, layer_blocks, mem, r, max(num_c - 1 - _draw(rng, 3), 1))
            if _excess(p, layer_blocks, mem) > 0:
                continue
        elif n == 0 or kind == 2:
            # Raise a request by one to three patterns; descend then spends
            # the memory it frees.
            r = _draw(rng, num_r)
            if trial[r] == num_c - 1:
                continue
            _move(p, trial, layer_blocks, mem, r, min(trial[r] + 1 + _draw(rng, 3), num_c - 1))
        else:
            # Drop one offloading request (two for kind 1) to fewer patterns,
            # then fill.
            r = offloading[_draw(rng, n)]
            _move(p, trial, layer_blocks, mem, r, _draw(rng, trial[r]))
            if kind == 1 and n > 1:
                q = offloading[_draw(rng, n)]
                _move(p, trial, layer_blocks, mem, q, _draw(rng, trial[q] + 1))
            before = work[0]
            filled = _fill(p, trial, layer_blocks, mem, r, no_seeds, work, deadline, scratch)
            tally[5] += work[0] - before
            if work[2]:
                break
            if not filled:
                continue
        lat, tie = evaluate_one(p, trial)
        if _tick(work, deadline):
            break
        if not np.isfinite(lat):
            continue
        lat, tie, _ = descend(p, trial, lat, tie, work, deadline, tally, stagger)
        if _better(lat, tie, best, best_tie, p[13]):
            choice[:] = trial
            best, best_tie = lat, tie
            tally[11] += 1
        if work[2]:
            break
    return best, best_tie, work[2] == 0


@jit
def _draw(rng: Any, n: int) -> int:
    """A pseudo-random integer in [0, n) (xorshift64*; n >= 1)."""
    x = rng[0]
    x ^= x >> np.uint64(12)
    x ^= x << np.uint64(25)
    x ^= x >> np.uint64(27)
    rng[0] = x
    mixed = x * np.uint64(2685821657736338717)
    return int((mixed >> np.uint64(11)) % np.uint64(max(n, 1)))


@jit
def stall_greedy(  # noqa: PLR0917
    blocks: Any,
    layers_of: Any,
    count: Any,
    fetched: Any,
    hidden: Any,
    mem_coef: Any,
    mem_cap: Any,
    slo_coef: Any,
    slo_cap: Any,
    stall_weight: int,
    window_weight: int,
) -> Any:
    """The surrogate-minded start (see the module's docstring)."""
    num_r = blocks.shape[0]
    num_c = count.shape[0]
    num_l = hidden.shape[0]
    num_w = mem_cap.shape[0]
    choice = np.zeros(num_r, np.int64)
    layer_blocks = np.zeros(num_l, np.int64)
    mem = np.zeros(num_w, np.int64)
    slo = np.zeros(num_w, np.int64)
    for r in range(num_r):
        for w in range(num_w):
            mem[w] += mem_coef[w, r, 0]
            slo[w] += slo_coef[w, r, 0]
    trial = np.zeros(num_l, np.int64)
    for _ in range(num_r * num_c + 1):
        here_stall = 0
        for layer in range(num_l):
            here_stall += max(layer_blocks[layer] - hidden[layer], 0)
        here_excess = mem[0] + _largest(layer_blocks) - mem_cap[0]
        total = 0
        for q in range(num_r):
            total += fetched[q, choice[q]]
        best_obj, obj_r, obj_c = np.inf, -1, -1
        best_score, score_r, score_c = np.inf, -1, -1
        for r in range(num_r):
            old = choice[r]
            b = blocks[r]
            for c in range(num_c):
                trial[:] = layer_blocks
                for j in range(count[old]):
                    trial[layers_of[old, j]] -= b
                for j in range(count[c]):
                    trial[layers_of[c, j]] += b
                stall = 0
                for layer in range(num_l):
                    stall += max(trial[layer] - hidden[layer], 0)
                buffer = _largest(trial)
                held = 0
                for w in range(num_w):
                    m = mem[w] + mem_coef[w, r, c] - mem_coef[w, r, old] + buffer
                    s = slo[w] + slo_coef[w, r, c] - slo_coef[w, r, old] + stall
                    if m > mem_cap[w] or s > slo_cap[w]:
                        break
                    held = w + 1
                if held > 0:
                    moved = total + fetched[r, c] - fetched[r, old]
                    obj = stall_weight * stall + window_weight * (num_w - held) + moved
                    if obj < best_obj:
                        best_obj, obj_r, obj_c = obj, r, c
                excess = mem[0] + mem_coef[0, r, c] - mem_coef[0, r, old] + buffer - mem_cap[0]
                freed = here_excess - excess
                if freed > 0:
                    own = fetched[r, c] - fetched[r, old]
                    score = (stall - here_stall + 1e-6 * own) / freed
                    if score < best_score:
                        best_score, score_r, score_c = score, r, c
        if obj_r >= 0:
            choice[obj_r] = obj_c
            return choice
        if here_excess <= 0 or score_r < 0:
            return choice
        old = choice[score_r]
        for j in range(count[old]):
            layer_blocks[layers_of[old, j]] -= blocks[score_r]
        for j in range(count[score_c]):
            layer_blocks[layers_of[score_c, j]] += blocks[score_r]
        for w in range(num_w):
            mem[w] += mem_coef[w, score_r, score_c] - mem_coef[w, score_r, old]
            slo[w] += slo_coef[w, score_r, score_c] - slo_coef[w, score_r, old]
        choice[score_r] = score_c
    return choice
