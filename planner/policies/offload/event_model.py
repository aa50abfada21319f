"""The exact event model of one decode step under layer offload (DESIGN.md
§3.2 "Latency model"; OrbitFlow §3.3.1 "Scheduling KV Prefetching").

Rules, as the spec states them:
- Layers run in order for the whole batch. Layer l starts when layer l-1 has
  ended and every request that offloads layer l has its fetch for l finished.
- A request has at most one fetch in flight, started greedily as soon as its
  current layer's KV is resident.
- Active fetches share the link bandwidth B equally; when one finishes the
  others re-share it (processor sharing, work-conserving).

Interpretation of "as soon as its current layer's KV is resident": the
current layer is the one the batch is running or waiting to run (the paper's
stream condition (1), "the execution of layer l must reuse the request's
prefetch buffer"). Each request has a one-layer prefetch slot, so its fetch of
offloaded layer o_j is released when layer o_(j-1) has been computed (its
slot is free again and the batch has moved past it), and its first fetch at
time 0. A fetch finished early waits in the slot; the next one does not start
before that layer is consumed (no double buffering).

Memory note: requests fetch different layers at the same time (request A its
layer 4 while request B its layer 3), so the slots in use at one instant can
exceed DESIGN's B_buf = max_l sum_r (1 - x_rl) b_r; peak_buffer_blocks
measures the real peak of a timeline.

Greedy fair sharing is not an optimal schedule, and with two or more
requests the latency is not monotone: an early-released fetch for a later
layer takes link share from a more urgent one, so more bandwidth can make a
step longer and one more offloaded layer can make it shorter (the tests pin
one case of each). With one request both are monotone.

The step is simulated event by event: at most one event per fetch plus one
per layer. Processor sharing is tracked as the service V every active fetch
has received so far; a fetch of b blocks released at V0 finishes when V
reaches V0 + b, so a heap of finish values gives the next completion.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from planner.policies.offload.step import StepInputs, StepTimeline

IntArray = npt.NDArray[np.intp]


def simulate_step(inputs: StepInputs) -> StepTimeline:
    """The exact timeline of one decode step."""
    trace = _simulate(inputs)
    starts = np.array(trace.layer_start)
    ends = np.array(trace.layer_end)
    previous_end = np.concatenate(([0.0], ends[:-1]))
    fetch_start_s = np.full(inputs.resident.shape, np.nan)
    fetch_end_s = np.full(inputs.resident.shape, np.nan)
    fetch_start_s[trace.rows, trace.layers] = trace.fetch_start
    fetch_end_s[trace.rows, trace.layers] = trace.fetch_end
    return StepTimeline(
        latency_s=trace.latency_s,
        layer_start_s=starts,
        layer_end_s=ends,
        stall_s=starts - previous_end,
        fetch_start_s=fetch_start_s,
        fetch_end_s=fetch_end_s,
    )


def step_latency_s(inputs: StepInputs) -> float:
    """The exact decode step latency (simulate_step without building arrays)."""
    return _simulate(inputs).latency_s


@dataclass(frozen=True, slots=True)
class _Trace:
    latency_s: float
    layer_start: list[float]
    layer_end: list[float]
    rows: IntArray
    layers: IntArray
    fetch_start: list[float]
    fetch_end: list[float]


def _simulate(inputs: StepInputs) -> _Trace:
    num_layers = inputs.num_layers
    comp = inputs.comp_s.tolist()
    bandwidth = inputs.bandwidth_blocks_per_s
    rows, layers = np.nonzero(~inputs.resident)
    # Fetch f (request rows[f], layer layers[f]) is released before layer
    # released_before[f]: after the request's previous offloaded layer, or at 0.
    released_before = np.zeros(rows.size, dtype=np.int64)
    if rows.size > 1:
        same_request = rows[1:] == rows[:-1]
        released_before[1:] = np.where(same_request, layers[:-1] + 1, 0)
    order = np.argsort(released_before, kind="stable")
    bounds = np.searchsorted(released_before[order], np.arange(num_layers + 1)).tolist()
    order_list = order.tolist()
    sizes = inputs.kv_blocks[rows].tolist()
    fetch_layer = layers.tolist()
    unfinished = np.bincount(layers, minlength=num_layers).tolist()

    fetch_start = [0.0] * rows.size
    fetch_end = [0.0] * rows.size
    layer_start = [0.0] * num_layers
    layer_end = [0.0] * num_layers
    heap: list[tuple[float, int]] = []
    now = 0.0
    service = 0.0  # blocks every active fetch has received so far
    push = heapq.heappush
    pop = heapq.heappop
    for layer in range(num_layers):
        for f in order_list[bounds[layer] : bounds[layer + 1]]:
            push(heap, (service + sizes[f], f))
            fetch_start[f] = now
        while unfinished[layer]:
            done_at, f = heap[0]
            now += (done_at - service) * len(heap) / bandwidth
            service = done_at
            pop(heap)
            fetch_end[f] = now
            unfinished[fetch_layer[f]] -= 1
        layer_start[layer] = now
        end = now + comp[layer]
        while heap:
            done_at, f = heap[0]
            finish = now + (done_at - service) * len(heap) / bandwidth
            if finish > end:
                service += (end - now) * bandwidth / len(heap)
                break
            now = finish
            service = done_at
            pop(heap)
            fetch_end[f] = now
            unfinished[fetch_layer[f]] -= 1
        now = end
        layer_end[layer] = end
    return _Trace(now, layer_start, layer_end, rows, layers, fetch_start, fetch_end)
