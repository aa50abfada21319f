"""C2CServe serverless policy (DESIGN.md §3.5): bandwidth-aware placement of
CPU-resident models on MIG slices, per-request routing, chunk-size and
kernel-family choice, and the HybridGEMM knob tuner."""

from planner.policies.serverless.chunks import choose_chunk
from planner.policies.serverless.kernels import KERNEL_REPOSITORY, PRECISIONS, choose_kernel
from planner.policies.serverless.placement import (
    UNPLACED,
    contention,
    fits,
    greedy_assignment,
    lexicographic_key,
    objective,
    plan_placement,
    violation,
)
from planner.policies.serverless.residency import resident_split
from planner.policies.serverless.routing import (
    ACTIVE,
    EVICT,
    HELD,
    IDLE,
    INACTIVE,
    LOWER_PRIORITY,
    QUEUE,
    SHARE,
    STARVING,
    check_slices,
    eviction_order,
    residents,
    route_request,
    schedule_waiting,
    service_order,
    starvation_bound_s,
)
from planner.policies.serverless.sharing import (
    GIVE_UP,
    MOVE,
    QUEUE_BACK,
    ShareEnd,
    Sharer,
    end_share,
)
from planner.policies.serverless.tuner import (
    KnobDecision,
    KnobObservation,
    RhoTuner,
    TunerParams,
    TunerState,
    tune,
)
from planner.policies.serverless.turns import next_turn

__all__ = [
    "ACTIVE",
    "EVICT",
    "GIVE_UP",
    "HELD",
    "IDLE",
    "INACTIVE",
    "KERNEL_REPOSITORY",
    "LOWER_PRIORITY",
    "MOVE",
    "PRECISIONS",
    "QUEUE",
    "QUEUE_BACK",
    "SHARE",
    "STARVING",
    "UNPLACED",
    "KnobDecision",
    "KnobObservation",
    "RhoTuner",
    "ShareEnd",
    "Sharer",
    "TunerParams",
    "TunerState",
    "check_slices",
    "choose_chunk",
    "choose_kernel",
    "contention",
    "end_share",
    "eviction_order",
    "fits",
    "greedy_assignment",
    "lexicographic_key",
    "next_turn",
    "objective",
    "plan_placement",
    "resident_split",
    "residents",
    "route_request",
    "schedule_waiting",
    "service_order",
    "starvation_bound_s",
    "tune",
    "violation",
]
