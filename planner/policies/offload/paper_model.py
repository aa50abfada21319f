"""OrbitFlow's Algorithm 1 ("Batch-level decode latency given a KV
placement"), literally (DESIGN.md §3.2, `model="paper"`).

For each layer l, the transfers in flight are sorted by size and walked in
that order until every transfer blocking l is done; each one costs its full
size at the share B / n of the n transfers still in the walk, and the elapsed
sum is compared with the previous layer's compute time only. So a fetch is
overlapped with one layer of compute at most, and a stream left after a
faster one finishes is charged its whole size again at the new share (true
processor sharing would charge only what remains). This is what reproduces
the paper's Fig. 3 count for Placement A at Step 1 ("9 units of stalls"). At
Step 16 it gives A 11 (the figure's 12 counts whole layer-time slots), and it
cannot give B and C their "perfect overlap": a 6-block fetch at 3 blocks per
layer time needs two layers of overlap (the exact model gives B none).

CANSTART is not spelled out in the paper. We take its stream conditions
(§3.3.1): before layer l, a request with no transfer in flight starts its next
offloaded layer's transfer when its layer-l KV is resident (condition 1) or
when that next layer is l itself (the just-in-time fetch condition 1 would
otherwise never start, e.g. when layer 1 or two adjacent layers are
offloaded). A transfer started early stays in Cur at its full size until a
walk removes it; one removed in another layer's walk counts as finished.
"""

from __future__ import annotations

import numpy as np

from planner.policies.offload.step import FloatArray, StepInputs, StepTimeline, timeline_from_stalls


def paper_stalls_s(inputs: StepInputs) -> FloatArray:
    """(L,) stall_l of Algorithm 1 (T_batch = sum comp + sum stall)."""
    num_layers = inputs.num_layers
    comp = inputs.comp_s.tolist()
    bandwidth = inputs.bandwidth_blocks_per_s
    sizes = inputs.kv_blocks.tolist()
    resident = inputs.resident.tolist()
    pending = [np.flatnonzero(~row).tolist()[::-1] for row in inputs.resident]
    # Transfers in flight as (size, request, layer); a request has at most one.
    current: list[tuple[float, int, int]] = []
    busy = [False] * len(sizes)
    stalls = [0.0] * num_layers
    comp_prev = 0.0
    for layer in range(num_layers):
        for request, queue in enumerate(pending):
            if queue and not busy[request] and (resident[request][layer] or queue[-1] == layer):
                current.append((sizes[request], request, queue.pop()))
                busy[request] = True
        blocking = sum(1 for _, _, dest in current if dest == layer)
        current.sort()
        elapsed = 0.0
        stall = 0.0
        walked = 0
        while blocking:
            size, request, dest = current[walked]
            elapsed += size / (bandwidth / (len(current) - walked))
            if elapsed > comp_prev:
                stall = elapsed - comp_prev
            if dest == layer:
                blocking -= 1
            busy[request] = False
            walked += 1
        del current[:walked]
        stalls[layer] = stall
        comp_prev = comp[layer]
    return np.array(stalls, dtype=np.float64)


def paper_timeline(inputs: StepInputs) -> StepTimeline:
    """Algorithm 1's stalls laid out as a timeline (fetches are not timed)."""
    return timeline_from_stalls(inputs.comp_s, paper_stalls_s(inputs), inputs.num_requests)


def paper_latency_s(inputs: StepInputs) -> float:
    """T_batch = Comp_tot + Stall_tot of Algorithm 1, summed in layer order."""
    comp: list[float] = inputs.comp_s.tolist()
    stalls: list[float] = paper_stalls_s(inputs).tolist()
    return sum(comp) + sum(stalls)
