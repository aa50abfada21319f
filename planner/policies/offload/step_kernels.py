"""Compiled step-latency kernels for the layer-offload search (DESIGN.md §3.2):
the exact event model, one assignment at a time or many per call, and a
lower bound on it.

numba compiles them when it is installed (a dependency; the compiled code is
cached next to this file); without it the same functions run as plain Python,
which gives the same numbers, some fifty times slower. event_model.py is the
readable reference of the exact model and the tests hold the two equal.

Assignments are given as pattern indices: request r takes pattern
choices[n, r], whose offloaded layers are layers_of[c, :count[c]] (ascending).

- step_latency: the event model of event_model.py (a request's next fetch
  is released when its previous offloaded layer has been computed, its first
  at time 0; active fetches share the link equally) for one assignment, with
  the active fetches in a binary heap keyed by the service at which each
  finishes; it stops early once the step must end past a given limit (the
  local search's comparisons). exact_latencies: it for many assignments.
- relaxed_latencies: a lower bound on that latency for every schedule of the
  link, fair sharing included. A fetch released at the end of layer m (or at
  0) cannot start before then, every fetch for layers <= l is done before
  layer l starts, and the link moves at most B blocks per second, so
  start_l >= end_m + V(m, l) / B, V(m, l) the blocks released at or after the
  end of layer m for layers <= l; and start_l >= end_(l-1). Laid out layer by
  layer that is the latency of the best (most-urgent-first) link schedule.
  Requests not yet placed (a search node) add `extra` blocks released at 0 and
  needed by the last layer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
F = TypeVar("F", bound=Callable[..., Any])

# step_latency stops only when the partial sums pass its limit by more than
# this fraction (they round differently from the full sum).
STOP_RTOL = 1e-9

try:
    import numba

    COMPILED = True

    def jit(function: F) -> F:
        return cast(F, numba.njit(cache=True, nogil=True)(function))

    def jit_with_gil(function: F) -> F:
        """For a function with an object-mode block (which needs the GIL)."""
        return cast(F, numba.njit(cache=True)(function))

except ImportError:  # pragma: no cover - numba is a dependency
    COMPILED = False

    def jit(function: F) -> F:
        return function

    jit_with_gil = jit


@jit
def _push(heap_v: Any, heap_r: Any, size: int, value: float, request: int) -> int:
    i = size
    while i > 0:
        parent = (i - 1) // 2
        if heap_v[parent] <= value:
            break
        heap_v[i] = heap_v[parent]
        heap_r[i] = heap_r[parent]
        i = parent
    heap_v[i] = value
    heap_r[i] = request
    return size + 1


@jit
def _pop(heap_v: Any, heap_r: Any, size: int) -> int:
    size -= 1
    value = heap_v[size]
    request = heap_r[size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and heap_v[child + 1] < heap_v[child]:
            child += 1
        if heap_v[child] >= value:
            break
        heap_v[i] = heap_v[child]
        heap_r[i] = heap_r[child]
        i = child
    if size > 0:
        heap_v[i] = value
        heap_r[i] = request
    return size


@jit
def step_latency(  # noqa: PLR0917
    comp: Any,
    remaining: Any,
    bandwidth: float,
    blocks: Any,
    layers_of: Any,
    count: Any,
    choice: Any,
    limit: float,
    scratch: Any,
) -> float:
    """The exact step latency of one assignment choice (R,); +inf as soon as
    it must exceed `limit` (by more than float rounding, STOP_RTOL). At the
    start of layer l (time t) the step ends no earlier than t + remaining[l]
    (remaining[l] = comp[l:].sum()), nor before the blocks not yet moved have
    crossed the link and the last offloaded layer m has run:
    t + pending / B + remaining[m]. scratch: step_scratch(R, L); its
    `idle` (L,) is left with the link's idle time in each layer's compute
    while blocks are still to be moved (of the layers simulated)."""
    heap_v, heap_r, released, target, unfinished, bucket, link, idle = scratch
    limit = limit * (1 + STOP_RTOL)
    num_r = choice.shape[0]
    num_l = comp.shape[0]
    unfinished[:num_l] = 0
    bucket[: num_l + 1] = -1
    idle[:num_l] = 0.0
    size = 0
    now = 0.0
    service = 0.0
    pending = 0.0  # blocks not yet moved
    last = -1  # the last offloaded layer
    for r in range(num_r):
        c = choice[r]
        for j in range(count[c]):
            unfinished[layers_of[c, j]] += 1
        released[r] = 0
        if count[c] > 0:
            link[r] = bucket[0]
            bucket[0] = r
            pending += blocks[r] * count[c]
            last = max(last, layers_of[c, count[c] - 1])
    for layer in range(num_l):
        r = bucket[layer]
        while r >= 0:
            following = link[r]
            c = choice[r]
            j = released[r]
            target[r] = layers_of[c, j]
            released[r] = j + 1
            size = _push(heap_v, heap_r, size, service + blocks[r], r)
            if j + 1 < count[c]:
                after = layers_of[c, j] + 1
                link[r] = bucket[after]
                bucket[after] = r
            r = following
        while unfinished[layer] > 0:
            done = heap_v[0]
            r = heap_r[0]
            now += (done - service) * size / bandwidth
            pending -= (done - service) * size
            service = done
            size = _pop(heap_v, heap_r, size)
            unfinished[target[r]] -= 1
        if now + remaining[layer] > limit:
            return np.inf
        if layer <= last and now + pending / bandwidth + remaining[last] > limit:
            return np.inf
        end = now + comp[layer]
        while size > 0:
            done = heap_v[0]
            finish = now + (done - service) * size / bandwidth
            if finish > end:
                pending -= (end - now) * bandwidth
                service += (end - now) * bandwidth / size
                break
            now = finish
            pending -= (done - service) * size
            service = done
            r = heap_r[0]
            size = _pop(heap_v, heap_r, size)
            unfinished[target[r]] -= 1
        if size == 0 and pending > 0.5:  # blocks still to move (not rounding)
            idle[layer] = end - now
        now = end
    return now


@jit
def step_scratch(num_r: int, num_l: int) -> Any:
    """Work arrays for step_latency: a heap of fetches (finish service,
    request), per request the fetches released and the layer in flight, per
    layer the fetches unfinished, per layer the requests whose next fetch
    is released before it (linked lists), and per layer the link's idle
    time."""
    size = max(num_r, 1)
    return (
        np.empty(size),
        np.empty(size, np.int64),
        np.zeros(size, np.int64),
        np.zeros(size, np.int64),
        np.zeros(num_l + 1, np.int64),
        np.full(num_l + 1, -1, np.int64),
        np.full(size, -1, np.int64),
        np.zeros(max(num_l, 1)),
    )


@jit
def remaining_compute(comp: Any) -> Any:
    """remaining[l] = comp[l:].sum() (remaining[L] = 0)."""
    num_l = comp.shape[0]
    out = np.zeros(num_l + 1)
    for layer in range(num_l - 1, -1, -1):
        out[layer] = out[layer + 1] + comp[layer]
    return out


@jit
def exact_latencies(  # noqa: PLR0917
    comp: Any, bandwidth: float, blocks: Any, layers_of: Any, count: Any, choices: Any
) -> Any:
    """(N,) exact step latency of each row of choices (N, R)."""
    num, num_r = choices.shape
    out = np.empty(num)
    scratch = step_scratch(num_r, comp.shape[0])
    remaining = remaining_compute(comp)
    for n in range(num):
        out[n] = step_latency(
            comp, remaining, bandwidth, blocks, layers_of, count, choices[n], np.inf, scratch
        )
    return out


@jit
def fetch_tally(blocks: Any, layers_of: Any, count: Any, choice: Any, per_layer: Any) -> Any:
    """(blocks fetched per step, the most fetched for one layer: the prefetch
    buffer) of one assignment choice (R,); per_layer (L,) is left with the
    blocks fetched for each layer."""
    per_layer[:] = 0
    total = 0
    for r in range(choice.shape[0]):
        c = choice[r]
        b = int(blocks[r])
        for j in range(count[c]):
            per_layer[layers_of[c, j]] += b
        total += b * count[c]
    most = 0
    for layer in range(per_layer.shape[0]):
        most = max(most, per_layer[layer])
    return total, most


@jit
def windows_held(  # noqa: PLR0917
    latency: float,
    bandwidth: float,
    buffer: int,
    mem_coef: Any,
    mem_cap: Any,
    slo_coef: Any,
    slo_cap_s: Any,
    slo_rtol: float,
    choice: Any,
) -> int:
    """How many window options, a prefix, one assignment choice (R,) of this
    latency and prefetch buffer holds: memory row coef + buffer <= cap, SLO
    row latency + coef / B <= cap."""
    held = 0
    for w in range(mem_cap.shape[0]):
        mem = buffer
        slo = 0.0
        for r in range(choice.shape[0]):
            mem += mem_coef[w, r, choice[r]]
            slo += slo_coef[w, r, choice[r]]
        if mem > mem_cap[w]:
            break
        if latency + slo / bandwidth > slo_cap_s[w] * (1 + slo_rtol):
            break
        held = w + 1
    return held


@jit
def score_assignments(  # noqa: PLR0917
    comp: Any,
    bandwidth: float,
    blocks: Any,
    layers_of: Any,
    count: Any,
    mem_coef: Any,
    mem_cap: Any,
    slo_coef: Any,
    slo_cap_s: Any,
    slo_rtol: float,
    choices: Any,
) -> Any:
    """problem.py's evaluation of choices (N, R): (latency, held, fetched,
    buffer) per row; held counts the window options, a prefix, whose memory
    row (coef + buffer <= cap) and SLO row (latency + coef / B <= cap) hold."""
    num = choices.shape[0]
    num_l = comp.shape[0]
    latency = exact_latencies(comp, bandwidth, blocks, layers_of, count, choices)
    held = np.zeros(num, np.int64)
    fetched = np.zeros(num, np.int64)
    buffer = np.zeros(num, np.int64)
    per_layer = np.zeros(max(num_l, 1), np.int64)
    for n in range(num):
        total, most = fetch_tally(blocks, layers_of, count, choices[n], per_layer)
        fetched[n] = total
        buffer[n] = most
        held[n] = windows_held(
            latency[n],
            bandwidth,
            most,
            mem_coef,
            mem_cap,
            slo_coef,
            slo_cap_s,
            slo_rtol,
            choices[n],
        )
    return latency, held, fetched, buffer


@jit
def score_leaves(  # noqa: PLR0917
    comp: Any,
    bandwidth: float,
    blocks: Any,
    layers_of: Any,
    count: Any,
    mem_coef: Any,
    mem_cap: Any,
    slo_coef: Any,
    slo_cap_s: Any,
    slo_rtol: float,
    window_weight: float,
    choices: Any,
    cutoff: float,
) -> Any:
    """The search tree's leaves: (objective, tiebreak) of choices (N, R) as
    problem.py's evaluation gives them (objective: the latency, +inf when no
    window holds; tiebreak: window_weight * windows not held + blocks
    fetched), except that a row whose first window's memory row fails is not
    simulated and one whose step must end past `cutoff` is stopped there
    (objective +inf for both): only the rows that can come within float
    rounding of cutoff are exact."""
    num, num_r = choices.shape
    num_w = mem_cap.shape[0]
    num_l = comp.shape[0]
    latency = np.full(num, np.inf)
    held = np.zeros(num, np.int64)
    fetched = np.zeros(num, np.int64)
    per_layer = np.zeros(max(num_l, 1), np.int64)
    scratch = step_scratch(num_r, num_l)
    remaining = remaining_compute(comp)
    for n in range(num):
        total, most = fetch_tally(blocks, layers_of, count, choices[n], per_layer)
        fetched[n] = total
        mem = most
        for r in range(num_r):
            mem += mem_coef[0, r, choices[n, r]]
        if num_w > 0 and mem > mem_cap[0]:
            continue
        latency[n] = step_latency(
            comp, remaining, bandwidth, blocks, layers_of, count, choices[n], cutoff, scratch
        )
        if not np.isfinite(latency[n]):
            continue
        held[n] = windows_held(
            latency[n],
            bandwidth,
            most,
            mem_coef,
            mem_cap,
            slo_coef,
            slo_cap_s,
            slo_rtol,
            choices[n],
        )
    objective = np.full(num, np.inf)
    tiebreak = np.empty(num)
    for n in range(num):
        if held[n] > 0:
            objective[n] = latency[n]
        tiebreak[n] = window_weight * (num_w - held[n]) + fetched[n]
    return objective, tiebreak


@jit
def relaxed_latencies(  # noqa: PLR0917
    comp: Any,
    bandwidth: float,
    blocks: Any,
    layers_of: Any,
    count: Any,
    order: Any,
    choices: Any,
    extra: Any,
) -> Any:
    """(N,) lower bound on the exact latency of each row of choices (N, D):
    requests order[:D] placed, `extra` blocks more from the others."""
    num, depth = choices.shape
    num_l = comp.shape[0]
    out = np.empty(num)
    volume = np.zeros((num_l + 1, num_l))  # [release row m, target l]
    end = np.zeros(num_l + 1)  # end[m]: end of layer m - 1 (end[0] = 0)
    for n in range(num):
        volume[:, :] = 0.0
        first = num_l
        for d in range(depth):
            r = order[d]
            c = choices[n, d]
            b = blocks[r]
            row = 0
            for j in range(count[c]):
                layer = layers_of[c, j]
                volume[row, layer] += b
                row = layer + 1
                first = min(first, layer)
        if num_l > 0:
            volume[0, num_l - 1] += extra[n]
            if extra[n] > 0:
                first = min(first, num_l - 1)
        # Suffix sums over release rows, prefix sums over target layers.
        for m in range(num_l - 1, -1, -1):
            for layer in range(num_l):
                volume[m, layer] += volume[m + 1, layer]
        for m in range(num_l + 1):
            for layer in range(1, num_l):
                volume[m, layer] += volume[m, layer - 1]
        end[0] = 0.0
        for layer in range(num_l):
            start = end[layer]
            if layer >= first:
                for m in range(layer + 1):
                    t = end[m] + volume[m, layer] / bandwidth
                    start = max(start, t)
            end[layer + 1] = start + comp[layer]
        out[n] = end[num_l]
    return out


def pattern_layers(offloaded: npt.NDArray[np.bool_]) -> tuple[IntArray, IntArray]:
    """(layers_of (C, K) padded with -1, count (C,)) of patterns (C, L)."""
    count = offloaded.sum(axis=1).astype(np.int64)
    width = max(int(count.max()) if count.size else 0, 1)
    layers_of = np.full((offloaded.shape[0], width), -1, dtype=np.int64)
    for c, row in enumerate(offloaded):
        found = np.flatnonzero(row)
        layers_of[c, : found.size] = found
    return layers_of, count


def exact_latency_of(
    comp_s: FloatArray,
    bandwidth_blocks_per_s: float,
    blocks: npt.ArrayLike,
    resident: npt.NDArray[np.bool_],
) -> float:
    """The exact step latency of one placement (resident (R, L))."""
    offloaded = ~np.asarray(resident, dtype=np.bool_)
    layers_of, count = pattern_layers(offloaded)
    rows = np.arange(offloaded.shape[0], dtype=np.int64)[None, :]
    if not rows.size:
        return float(np.sum(comp_s))
    out = exact_latencies(
        np.ascontiguousarray(comp_s, dtype=np.float64),
        float(bandwidth_blocks_per_s),
        np.asarray(blocks, dtype=np.float64),
        layers_of,
        count,
        rows,
    )
    return float(out[0])
