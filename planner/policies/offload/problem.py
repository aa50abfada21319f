"""The layer-offload problem in closed form (DESIGN.md §3.2): everything the
search needs to score an assignment of one pattern per request.

Objective, lexicographic: the exact event-model step latency (stall
included) at the next step; among equal latencies, the longer window; then
fewer blocks fetched per step. Constraints, per window option w held (the
options held form a prefix, the shortest always): the memory row at the
window's end (resident KV with the window's growth, the prefetch buffer
max_l F_l, each offloading request's growth) within the GPU budget, and the
SLO row: the step latency plus the window's growth of offloaded layers
fetched with no overlap within the window's latency ceiling. An assignment
holding no window is infeasible.

The linear surrogate of the ILP (ilp.py: stall_l = max(0, F_l - H_l) whole
block-times, H_l = floor(comp_(l-1) * B)) is kept as evaluate_surrogate: it
is the ILP's objective in closed form (the tests hold CP-SAT to it), and a
cheap guide for the search's starts and move ordering, never its objective.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from planner.policies.offload.ilp import WindowOption
from planner.policies.offload.search_space import OffloadCandidates
from planner.policies.offload.step_kernels import (
    exact_latencies,
    pattern_layers,
    score_assignments,
)

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

# Latencies within this fraction of each other are equal (float rounding of
# the event model); the tie-breaks decide between them.
LATENCY_RTOL = 1e-12
# The SLO row holds up to this rounding.
SLO_RTOL = 1e-9


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Assignments evaluated at once (N of them)."""

    objective: FloatArray  # (N,) exact step latency, s; +inf when infeasible
    tiebreak: FloatArray  # (N,) window_weight * (W - held) + fetched: smaller wins a tie
    latency_s: FloatArray  # (N,) exact step latency, infeasible ones too
    held: IntArray  # (N,) window options held (>= 1 when feasible)
    fetched: IntArray  # (N,) blocks fetched per step
    buffer: IntArray  # (N,) prefetch buffer, blocks

    def best(self) -> int:
        """Index of the best assignment (the first among exact ties)."""
        return best_index(self.objective, self.tiebreak)


@dataclass(frozen=True, slots=True)
class SurrogateEvaluation:
    """The ILP's objective (integers) for N assignments."""

    objective: FloatArray  # (N,) +inf when infeasible
    stall: IntArray  # (N,) total surrogate stall, block-times
    held: IntArray
    fetched: IntArray
    buffer: IntArray


def best_index(objective: FloatArray, tiebreak: FloatArray) -> int:
    low = float(objective.min()) if objective.size else math.inf
    if not math.isfinite(low):
        return 0
    tied = objective <= low * (1 + LATENCY_RTOL)
    return int(np.argmin(np.where(tied, tiebreak, np.inf)))


def better(objective: float, tiebreak: float, than_objective: float, than_tiebreak: float) -> bool:
    """(objective, tiebreak) strictly before (than_objective, than_tiebreak)."""
    if not math.isfinite(objective):
        return False
    if not math.isfinite(than_objective):
        return True
    if objective < than_objective * (1 - LATENCY_RTOL):
        return True
    if objective > than_objective * (1 + LATENCY_RTOL):
        return False
    return tiebreak < than_tiebreak


@dataclass(frozen=True, slots=True)
class Enumeration:
    """Exhaustive enumeration's answer: the best assignment tried."""

    choice: IntArray | None
    latency: float
    tiebreak: float
    tried: int  # assignments evaluated
    complete: bool  # every assignment tried: choice is the optimum


@dataclass(frozen=True, slots=True)
class OffloadProblem:
    """One batch as arrays (R requests, C patterns, L layers, W window options)."""

    comp_s: FloatArray  # (L,)
    bandwidth_blocks_per_s: float
    blocks: IntArray  # (R,) blocks per layer at the next step
    offloaded: BoolArray  # (C, L) patterns
    layers_of: IntArray  # (C, K) offloaded layers of each pattern, -1 padded
    count: IntArray  # (C,)
    fetch: IntArray  # (R, C, L) blocks request r fetches for layer l under c
    hidden: IntArray  # (L,) H_l of the surrogate
    fetched: IntArray  # (R, C) blocks fetched per step
    mem_coef: IntArray  # (W, R, C) memory row: sum coef + buffer <= mem_cap
    mem_cap: IntArray  # (W,)
    slo_coef: IntArray  # (W, R, C) blocks of growth fetched with no overlap
    slo_cap_s: FloatArray  # (W,) latency ceiling, +inf when the window has none
    slo_cap: FloatArray  # (W,) the surrogate's SLO row cap, block-times
    window_weight: int
    blocks_f: FloatArray  # (R,) blocks as floats (the kernels' input)
    slo_coef_f: FloatArray  # (W, R, C) slo_coef as floats

    @property
    def num_requests(self) -> int:
        return int(self.fetch.shape[0])

    @property
    def num_choices(self) -> int:
        return int(self.fetch.shape[1])

    @property
    def num_windows(self) -> int:
        return int(self.mem_cap.shape[0])

    @property
    def stall_weight(self) -> int:
        """The surrogate objective's weight of one block-time of stall."""
        return self.window_weight * self.num_windows

    def latencies(self, choice: IntArray) -> FloatArray:
        """(N,) exact step latency of (N, R) assignments."""
        out: FloatArray = exact_latencies(
            self.comp_s,
            self.bandwidth_blocks_per_s,
            self.blocks.astype(np.float64),
            self.layers_of,
            self.count,
            np.ascontiguousarray(choice, dtype=np.int64),
        )
        return out

    def evaluate(self, choice: npt.ArrayLike) -> Evaluation:
        """choice: (N, R) or (R,) pattern indices."""
        c = np.ascontiguousarray(np.atleast_2d(np.asarray(choice, dtype=np.int64)))
        latency, held, fetched, buffer = score_assignments(
            self.comp_s,
            self.bandwidth_blocks_per_s,
            self.blocks_f,
            self.layers_of,
            self.count,
            self.mem_coef,
            self.mem_cap,
            self.slo_coef_f,
            self.slo_cap_s,
            SLO_RTOL,
            c,
        )
        objective = np.where(held > 0, latency, np.inf)
        tiebreak = self.window_weight * (self.num_windows - held).astype(np.float64) + fetched
        return Evaluation(objective, tiebreak, latency, held, fetched, buffer)

    def evaluate_surrogate(self, choice: npt.ArrayLike) -> SurrogateEvaluation:
        """The ILP's objective: stall_weight * surrogate stall
        + window_weight * (W - held) + fetched."""
        c = np.atleast_2d(np.asarray(choice, dtype=np.int64))
        rows = np.arange(self.num_requests)
        per_layer = self.fetch[rows, c].sum(axis=1)
        stall = np.maximum(per_layer - self.hidden, 0).sum(axis=1)
        buffer = per_layer.max(axis=1) if per_layer.shape[1] else np.zeros(len(c), np.int64)
        fetched = self.fetched[rows, c].sum(axis=1)
        mem = self.mem_coef[:, rows, c].sum(axis=2) + buffer
        slo = self.slo_coef[:, rows, c].sum(axis=2) + stall
        holds = (mem <= self.mem_cap[:, None]) & (slo <= self.slo_cap[:, None])
        held = np.cumprod(holds, axis=0).sum(axis=0).astype(np.int64)
        objective = (
            self.stall_weight * stall.astype(np.float64)
            + self.window_weight * (self.num_windows - held).astype(np.float64)
            + fetched
        )
        objective[held == 0] = np.inf
        return SurrogateEvaluation(objective, stall, held, fetched, buffer)

    def enumeration_size(self) -> int:
        return int(self.num_choices**self.num_requests)

    def enumerate(
        self, *, chunk: int = 1 << 14, stop: Callable[[], bool] | None = None
    ) -> Enumeration:
        """The exact optimum by trying every assignment (the reference for
        small instances); choice None and latency inf when infeasible. Exact
        ties go to the assignment first in lexicographic order. `stop`, asked
        between chunks, ends it early (the best so far, `complete` False)."""
        total = self.enumeration_size()
        best_choice: IntArray | None = None
        best, best_tie = math.inf, math.inf
        radix = self.num_choices ** np.arange(self.num_requests - 1, -1, -1, dtype=np.int64)
        for start in range(0, total, chunk):
            if start and stop is not None and stop():
                return Enumeration(best_choice, best, best_tie, start, complete=False)
            codes = np.arange(start, min(start + chunk, total), dtype=np.int64)
            choice = (codes[:, None] // radix[None, :]) % self.num_choices
            ev = self.evaluate(choice)
            i = ev.best()
            if better(float(ev.objective[i]), float(ev.tiebreak[i]), best, best_tie):
                best, best_tie = float(ev.objective[i]), float(ev.tiebreak[i])
                best_choice = choice[i].copy()
        return Enumeration(best_choice, best, best_tie, total, complete=True)


def offload_problem(
    comp_s: FloatArray,
    bandwidth_blocks_per_s: float,
    gpu_block_budget: int,
    blocks: IntArray,
    candidates: OffloadCandidates,
    *,
    windows: list[WindowOption],
) -> OffloadProblem:
    """The problem for one batch (the ILP of build_offload_ilp has the same
    constraints with the surrogate latency)."""
    num_layers = comp_s.shape[0]
    offloaded = candidates.offloaded.astype(np.int64)  # (C, L)
    count = candidates.count.astype(np.int64)
    b = blocks.astype(np.int64)
    bw = bandwidth_blocks_per_s
    fetch = b[:, None, None] * offloaded[None, :, :]
    hidden = np.floor(np.concatenate(([0.0], comp_s[:-1])) * bw + 1e-9).astype(np.int64)
    fetched = b[:, None] * count[None, :]
    offloads_any = (count > 0).astype(np.int64)
    mem_coef, mem_cap, slo_coef, slo_cap, slo_cap_s = [], [], [], [], []
    for option in windows:
        end = option.end_blocks.astype(np.int64)
        growth = end - b
        mem_coef.append(-end[:, None] * count[None, :] + growth[:, None] * offloads_any[None, :])
        mem_cap.append(gpu_block_budget - num_layers * int(end.sum()))
        slo_coef.append(growth[:, None] * count[None, :])
        slo_cap_s.append(option.ceiling_s)
        if math.isinf(option.ceiling_s):
            slo_cap.append(math.inf)
        else:
            slack = (option.ceiling_s - float(comp_s.sum())) * bw
            slo_cap.append(float(math.floor(slack + 1e-9)))
    window_weight = int(fetched.max(axis=1).sum()) + 1 if len(b) else 1
    layers_of, pattern_count = pattern_layers(candidates.offloaded)
    w, r, c = len(windows), len(b), len(count)
    return OffloadProblem(
        comp_s=np.ascontiguousarray(comp_s, dtype=np.float64),
        bandwidth_blocks_per_s=float(bw),
        blocks=b,
        offloaded=candidates.offloaded,
        layers_of=layers_of,
        count=pattern_count,
        fetch=fetch,
        hidden=hidden,
        fetched=fetched,
        mem_coef=np.array(mem_coef, dtype=np.int64).reshape(w, r, c),
        mem_cap=np.array(mem_cap, dtype=np.int64),
        slo_coef=np.array(slo_coef, dtype=np.int64).reshape(w, r, c),
        slo_cap_s=np.array(slo_cap_s, dtype=np.float64),
        slo_cap=np.array(slo_cap, dtype=np.float64),
        window_weight=window_weight,
        blocks_f=b.astype(np.float64),
        slo_coef_f=np.array(slo_coef, dtype=np.float64).reshape(w, r, c),
    )
