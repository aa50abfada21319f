"""The branch and bound's node bounds (search.py), compiled: for the
children of a node (requests order[:depth] placed, choices (N, depth)), a
lower bound on the exact step latency of every completion, a lower bound on
its tiebreak, and the dive key.

Per child: the blocks fetched per layer F by the requests placed, their
memory and SLO rows, and the prefetch buffer max F. The requests not yet
placed must free what the memory row still exceeds, which grows with the
buffer: at least nu . F + share * (blocks they fetch) for each (nu, share)
of buffer_bound.py; a few rounds of fetch >= cover(excess) (cover_bound.py's
curve at this depth) from below give the blocks they must fetch at least.
Those blocks are added to the relaxed-link latency (step_kernels.py) as
fetched before the last layer. The windows held are those whose memory row
(with the least the others can add) and SLO row (with the least growth the
others can add) can still hold, a prefix; none, or an excess the others
cannot free, makes the child infeasible (bound +inf).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from planner.policies.offload.step_kernels import jit, relaxed_latencies

# Rounds of fetch >= cover(excess grown by the buffer).
BUFFER_ROUNDS = 3


@jit
def _cover_at(xs: Any, ys: Any, need: float) -> float:
    """cover_bound.CoverCurve.at for one value."""
    clipped = max(need, 0.0)
    if clipped > xs[-1] * (1 + 1e-12) + 1e-9:
        return math.inf
    return float(np.interp(clipped, xs, ys))


@jit
def child_bounds(  # noqa: PLR0917
    comp: Any,
    bandwidth: float,
    blocks: Any,
    layers_of: Any,
    count: Any,
    order: Any,
    fetch: Any,
    fetched: Any,
    mem_coef: Any,
    mem_cap: Any,
    slo_coef: Any,
    slo_cap_s: Any,
    slo_rtol: float,
    window_weight: float,
    mem_min_suffix: Any,
    mem_max_free_suffix: Any,
    slo_min_suffix: Any,
    curve_xs: Any,
    curve_ys: Any,
    nus: Any,
    shares: Any,
    choices: Any,
) -> Any:
    """(bound, tiebreak, dive), each (N,), for choices (N, depth)."""
    num, depth = choices.shape
    num_r = fetch.shape[0]
    num_l = fetch.shape[2]
    num_w = mem_cap.shape[0]
    xs = curve_xs[depth]
    ys = curve_ys[depth]
    per_layer = np.zeros(max(num_l, 1), np.int64)
    must_fetch = np.zeros(num)
    need = np.zeros(num)
    mem = np.zeros((num, max(num_w, 1)), np.int64)
    slo = np.zeros((num, max(num_w, 1)), np.int64)
    buffer = np.zeros(num, np.int64)
    total = np.zeros(num)
    for n in range(num):
        per_layer[:] = 0
        for d in range(depth):
            r = order[d]
            c = choices[n, d]
            for layer in range(num_l):
                per_layer[layer] += fetch[r, c, layer]
            total[n] += fetched[r, c]
            for w in range(num_w):
                mem[n, w] += mem_coef[w, r, c]
                slo[n, w] += slo_coef[w, r, c]
        most = 0
        for layer in range(num_l):
            most = max(most, per_layer[layer])
        buffer[n] = most
        need[n] = float(mem[n, 0] + most - mem_cap[0])
        if depth == num_r:
            continue
        x = float(mem[n, 0] - mem_cap[0])
        to_free = max(need[n], 0.0)
        must = _cover_at(xs, ys, to_free)
        for _ in range(BUFFER_ROUNDS):
            for k in range(shares.shape[0]):
                weighted = 0.0
                for layer in range(num_l):
                    weighted += per_layer[layer] * nus[k, layer]
                known = must if math.isfinite(must) else 0.0
                to_free = max(to_free, x + weighted + shares[k] * known)
            must = max(must, _cover_at(xs, ys, to_free))
        if math.isfinite(must):
            must_fetch[n] = math.ceil(must - 1e-6)
        else:
            need[n] = math.inf
    latency = relaxed_latencies(
        comp, bandwidth, blocks, layers_of, count, order, choices, must_fetch
    )
    bound = np.full(num, np.inf)
    tiebreak = np.zeros(num)
    most_tie = 1.0
    for n in range(num):
        held = 0
        for w in range(num_w):
            if mem[n, w] + mem_min_suffix[w, depth] + buffer[n] > mem_cap[w]:
                break
            growth = (slo[n, w] + slo_min_suffix[w, depth]) / bandwidth
            if latency[n] + growth > slo_cap_s[w] * (1 + slo_rtol):
                break
            held = w + 1
        tiebreak[n] = window_weight * (num_w - held) + total[n] + must_fetch[n]
        most_tie = max(most_tie, tiebreak[n])
        if held > 0 and need[n] <= mem_max_free_suffix[depth]:
            bound[n] = latency[n]
    dive = np.full(num, np.inf)
    for n in range(num):
        if math.isfinite(bound[n]):
            dive[n] = latency[n] * (1 + 1e-9 * tiebreak[n] / most_tie)
    return bound, tiebreak, dive
