"""The layer-offload ILP (DESIGN.md §3.2; OrbitFlow §3.3), written once for
every solver backend.

Decision: y[r, c] = 1 when request r takes candidate pattern c (one-hot per
request); u[w] = 1 when the plan holds for at least window option w (options
ascending, u[0] = 1 and u[w] >= u[w+1]: the window is the last w with
u[w] = 1). The shortest window's constraints are therefore unconditional,
which keeps the LP relaxation tight (a one-hot window choice with big-M rows
let a fractional choice relax every row at once, and CP-SAT then took
seconds to prove a batch infeasible).

Everything is in *block units*: one block-time is the time the link takes to
move one layer's KV block (1 / B seconds). With b_r the blocks per layer of
request r at the next step and F_l = sum_{r,c} b_r offloaded[c, l] y[r, c]
the blocks fetched for layer l:

- stall_l >= F_l - H_l, stall_l >= 0, with H_l = floor(comp_(l-1) * B) the
  whole blocks the previous layer's compute hides (stall_l an integer
  number of block-times: a few microseconds on PCIe; plans are re-scored
  with the exact models after);
- buf >= F_l for every layer (the prefetch buffer, B_buf);
- memory at the end of window w, when u[w]: the resident KV with the
  window's growth, plus the buffer, plus each offloading request's growth
  (which can add that many blocks to one layer's fetch), <= B_GPU;
- SLO over window w, when u[w]: the latency at the window's last step,
  bounded by the first step's surrogate plus every offloaded layer's growth
  fetched with no overlap, <= the window's latency ceiling
  (window.latency_ceiling_s);
- objective (integers, lexicographic): total stall first, then a larger
  window, then fewer fetched blocks.

Both window constraints are conservative: a window the ILP accepts holds
under the surrogate with the exact growth (planner.py then extends the window
step by step while it still does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from planner.policies.offload.search_space import OffloadCandidates
from planner.solvers import Model, VarType

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class WindowOption:
    """One decode window the ILP may choose: its length, the largest step
    latency its SLO cap allows (seconds, inf when any) and each request's
    blocks per layer at its last step."""

    steps: int
    ceiling_s: float
    end_blocks: IntArray


@dataclass(frozen=True, slots=True)
class OffloadIlp:
    model: Model
    choice: npt.NDArray[np.int64]  # (R, C) ids of y
    window: npt.NDArray[np.int64]  # (W,) ids of u
    stall_layers: IntArray  # layers that can stall
    stall: npt.NDArray[np.int64]  # ids of their stall variables (block-times)
    # objective = stall_weight * total stall - window_weight * sum(u) + fetched blocks
    stall_weight: int
    window_weight: int


def build_offload_ilp(
    comp_s: FloatArray,
    bandwidth_blocks_per_s: float,
    gpu_block_budget: int,
    blocks: IntArray,
    candidates: OffloadCandidates,
    *,
    windows: list[WindowOption],
) -> OffloadIlp:
    """The model for one batch; `windows` ordered by steps ascending."""
    num_layers = comp_s.shape[0]
    num_requests = blocks.shape[0]
    num_choices = len(candidates)
    bw = bandwidth_blocks_per_s
    offloaded = candidates.offloaded.astype(np.float64)  # (C, L)
    count = candidates.count.astype(np.float64)  # (C,)
    b = blocks.astype(np.float64)

    m = Model(name=f"offload-{num_requests}x{num_choices}x{num_layers}")
    y = m.add_binaries(num_requests * num_choices).reshape(num_requests, num_choices)
    m.add_exactly_one_groups(y)
    u = m.add_vars(len(windows), VarType.BINARY, lb=np.eye(1, len(windows))[0], ub=1.0)
    if len(windows) > 1:
        nested = np.zeros((len(windows) - 1, len(windows)))
        nested[:, :-1] += np.eye(len(windows) - 1)
        nested[:, 1:] -= np.eye(len(windows) - 1)
        m.add_rows(nested, u, ">=", 0.0)
    y_flat = y.ravel()

    # fetch[l, r*C + c] = b_r * offloaded[c, l]
    fetch = (b[None, :, None] * offloaded.T[:, None, :]).reshape(num_layers, -1)
    max_fetch = fetch.reshape(num_layers, num_requests, num_choices).max(axis=2).sum(axis=1)
    # Whole blocks hidden: stall and buffer are integers (block-times,
    # blocks), so every backend rounds the same way (problem.py).
    comp_prev_blocks = np.floor(np.concatenate(([0.0], comp_s[:-1])) * bw + 1e-9)
    stall_layers = np.flatnonzero(max_fetch > comp_prev_blocks).astype(np.int64)
    stall_ub = np.ceil(max_fetch[stall_layers] - comp_prev_blocks[stall_layers])
    stall = m.add_integers(len(stall_layers), 0, np.maximum(stall_ub, 0.0))
    if len(stall_layers):
        m.add_max_lower_bound(stall, fetch[stall_layers], y_flat, -comp_prev_blocks[stall_layers])

    fetch_layers = np.flatnonzero(max_fetch > 0)
    buf_ub = float(max_fetch.max()) if num_layers else 0.0
    buf = int(m.add_integers(1, 0, max(buf_ub, 0.0))[0])
    if len(fetch_layers):
        m.add_max_lower_bound(buf, fetch[fetch_layers], y_flat)

    offloads_any = (count > 0).astype(np.float64)  # (C,)
    for w, option in enumerate(windows):
        end = option.end_blocks.astype(np.float64)
        growth = end - b
        # resident(w) + buf + growth of offloading requests <= budget
        #   resident(w) = L * sum(end) - sum_{r,c} end_r * count_c * y_rc
        coefs = (-end[:, None] * count[None, :] + growth[:, None] * offloads_any[None, :]).ravel()
        constant = num_layers * end.sum()
        worst = constant + buf_ub + growth.sum()
        big_m = 0.0 if w == 0 else worst - gpu_block_budget
        if w == 0 or big_m > 0:
            m.add_linear(
                np.concatenate((y_flat, [buf, u[w]])),
                np.concatenate((coefs, [1.0, big_m])),
                "<=",
                gpu_block_budget - constant + big_m,
            )
        if math.isinf(option.ceiling_s):
            continue
        # total stall + growth fetched (block-times) <= (ceiling - sum comp) * B
        slack = math.floor((option.ceiling_s - float(comp_s.sum())) * bw + 1e-9)
        growth_fetch = (growth[:, None] * count[None, :]).ravel()
        worst_lhs = float(stall_ub.sum()) + float(growth.sum()) * num_layers
        big_m = 0.0 if w == 0 else worst_lhs - slack
        if w == 0 or big_m > 0:
            m.add_linear(
                np.concatenate((stall, y_flat, [u[w]])),
                np.concatenate((np.ones(len(stall)), growth_fetch, [big_m])),
                "<=",
                slack + big_m,
            )

    fetched = (b[:, None] * count[None, :]).ravel()
    window_weight = int(fetched.reshape(num_requests, num_choices).max(axis=1).sum()) + 1
    stall_weight = window_weight * len(windows)
    m.minimize(
        np.concatenate((stall, u, y_flat)),
        np.concatenate(
            (np.full(len(stall), float(stall_weight)), np.full(len(u), -window_weight), fetched)
        ),
        constant=float(window_weight * len(windows)),
    )
    return OffloadIlp(m, y, u, stall_layers, stall, stall_weight, window_weight)
