"""The layer-offload ILP in closed form (DESIGN.md §3.2).

Once every request has a pattern, every other variable of the ILP (ilp.py) is
determined: the stall of layer l is max(0, F_l - H_l) whole block-times (F_l
the blocks fetched for it, H_l = floor(comp_(l-1) * B) the blocks its
predecessor's compute hides), the prefetch buffer is max_l F_l, and the
window indicators hold for the longest prefix of window options whose memory
and SLO rows hold. So the ILP's objective can be evaluated exactly for any
assignment, and for many at once. The branch and bound (search.py) and the
exhaustive reference use this; the tests check that CP-SAT's objective on the
ILP equals it.

Objective (integers, lexicographic): stall_weight * total stall
- window_weight * (windows held) + blocks fetched + window_weight * W.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from planner.policies.offload.ilp import WindowOption
from planner.policies.offload.search_space import OffloadCandidates

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Assignments evaluated at once (N of them)."""

    objective: FloatArray  # (N,) +inf when infeasible
    stall: IntArray  # (N,) total stall, block-times
    held: IntArray  # (N,) window options held (>= 1 when feasible)
    fetched: IntArray  # (N,) blocks fetched per step
    buffer: IntArray  # (N,) prefetch buffer, blocks


@dataclass(frozen=True, slots=True)
class OffloadProblem:
    """One batch's ILP as arrays (R requests, C patterns, L layers, W window
    options)."""

    fetch: IntArray  # (R, C, L) blocks request r fetches for layer l under c
    hidden: IntArray  # (L,) H_l
    fetched: IntArray  # (R, C) blocks fetched per step
    mem_coef: IntArray  # (W, R, C) memory row: sum coef + buffer <= mem_cap
    mem_cap: IntArray  # (W,)
    slo_coef: IntArray  # (W, R, C) SLO row: stall + sum coef <= slo_cap
    slo_cap: FloatArray  # (W,) +inf when the window has no SLO row
    stall_weight: int
    window_weight: int

    @property
    def num_requests(self) -> int:
        return int(self.fetch.shape[0])

    @property
    def num_choices(self) -> int:
        return int(self.fetch.shape[1])

    @property
    def num_windows(self) -> int:
        return int(self.mem_cap.shape[0])

    def objective_of(self, stall: int, held: int, fetched: int) -> int:
        return self.stall_weight * stall + self.window_weight * (self.num_windows - held) + fetched

    def evaluate(self, choice: npt.ArrayLike) -> Evaluation:
        """choice: (N, R) or (R,) pattern indices."""
        c = np.atleast_2d(np.asarray(choice, dtype=np.int64))
        rows = np.arange(self.num_requests)
        per_layer = self.fetch[rows, c].sum(axis=1)  # (N, L)
        stall = np.maximum(per_layer - self.hidden, 0).sum(axis=1)
        buffer = per_layer.max(axis=1) if per_layer.shape[1] else np.zeros(len(c), np.int64)
        fetched = self.fetched[rows, c].sum(axis=1)
        mem = self.mem_coef[:, rows, c].sum(axis=2) + buffer  # (W, N)
        slo = self.slo_coef[:, rows, c].sum(axis=2) + stall
        holds = (mem <= self.mem_cap[:, None]) & (slo <= self.slo_cap[:, None])
        prefix = np.cumprod(holds, axis=0)
        held = prefix.sum(axis=0).astype(np.int64)
        objective = (
            self.stall_weight * stall.astype(np.float64)
            + self.window_weight * (self.num_windows - held).astype(np.float64)
            + fetched
        )
        objective[held == 0] = np.inf
        return Evaluation(objective, stall, held, fetched, buffer)

    def enumeration_size(self) -> int:
        return int(self.num_choices**self.num_requests)

    def enumerate(self, *, chunk: int = 1 << 16) -> tuple[IntArray | None, float]:
        """The exact optimum by trying every assignment (the reference for
        small instances): (choice, objective), (None, inf) when infeasible.
        Ties go to the assignment first in lexicographic order."""
        total = self.enumeration_size()
        best_choice: IntArray | None = None
        best = math.inf
        radix = self.num_choices ** np.arange(self.num_requests - 1, -1, -1, dtype=np.int64)
        for start in range(0, total, chunk):
            codes = np.arange(start, min(start + chunk, total), dtype=np.int64)
            choice = (codes[:, None] // radix[None, :]) % self.num_choices
            objective = self.evaluate(choice).objective
            i = int(np.argmin(objective))
            if objective[i] < best:
                best, best_choice = float(objective[i]), choice[i].copy()
        return best_choice, best


def offload_problem(
    comp_s: FloatArray,
    bandwidth_blocks_per_s: float,
    gpu_block_budget: int,
    blocks: IntArray,
    candidates: OffloadCandidates,
    *,
    windows: list[WindowOption],
) -> OffloadProblem:
    """The closed form of build_offload_ilp's model for the same inputs."""
    num_layers = comp_s.shape[0]
    offloaded = candidates.offloaded.astype(np.int64)  # (C, L)
    count = candidates.count.astype(np.int64)
    b = blocks.astype(np.int64)
    bw = bandwidth_blocks_per_s
    fetch = b[:, None, None] * offloaded[None, :, :]
    hidden = np.floor(np.concatenate(([0.0], comp_s[:-1])) * bw + 1e-9).astype(np.int64)
    fetched = b[:, None] * count[None, :]
    offloads_any = (count > 0).astype(np.int64)
    mem_coef, mem_cap, slo_coef, slo_cap = [], [], [], []
    for option in windows:
        end = option.end_blocks.astype(np.int64)
        growth = end - b
        mem_coef.append(-end[:, None] * count[None, :] + growth[:, None] * offloads_any[None, :])
        mem_cap.append(gpu_block_budget - num_layers * int(end.sum()))
        slo_coef.append(growth[:, None] * count[None, :])
        if math.isinf(option.ceiling_s):
            slo_cap.append(math.inf)
        else:
            slack = (option.ceiling_s - float(comp_s.sum())) * bw
            slo_cap.append(float(math.floor(slack + 1e-9)))
    window_weight = int(fetched.max(axis=1).sum()) + 1 if len(b) else 1
    return OffloadProblem(
        fetch=fetch,
        hidden=hidden,
        fetched=fetched,
        mem_coef=np.array(mem_coef, dtype=np.int64).reshape(len(windows), len(b), len(count)),
        mem_cap=np.array(mem_cap, dtype=np.int64),
        slo_coef=np.array(slo_coef, dtype=np.int64).reshape(len(windows), len(b), len(count)),
        slo_cap=np.array(slo_cap, dtype=np.float64),
        stall_weight=window_weight * len(windows),
        window_weight=window_weight,
    )
