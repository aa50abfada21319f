"""OrbitFlow layer offload (DESIGN.md §3.2): latency models, the pruned
search space, Token-Deposit and the adaptive controller."""

from planner.policies.offload.controller import (
    AdaptiveController,
    ControllerConfig,
    ControllerDecision,
    ReplanReason,
    StepObservation,
)
from planner.policies.offload.deposit import DepositEvents, Release, TokenDeposit, Violation
from planner.policies.offload.event_model import simulate_step
from planner.policies.offload.latency import LatencyModel, predict_step, step_latency_s
from planner.policies.offload.memory import (
    gpu_blocks_needed,
    peak_buffer_blocks,
    prefetch_buffer_blocks,
)
from planner.policies.offload.paper_model import paper_stalls_s
from planner.policies.offload.search_space import (
    OffloadCandidates,
    SearchMode,
    candidate_patterns,
    pruned_choice_bound,
    pruned_choice_count,
)
from planner.policies.offload.step import StepInputs, StepTimeline
from planner.policies.offload.surrogate import surrogate_latency_s, surrogate_stalls_s

__all__ = [
    "AdaptiveController",
    "ControllerConfig",
    "ControllerDecision",
    "DepositEvents",
    "LatencyModel",
    "OffloadCandidates",
    "Release",
    "ReplanReason",
    "SearchMode",
    "StepInputs",
    "StepObservation",
    "StepTimeline",
    "TokenDeposit",
    "Violation",
    "candidate_patterns",
    "gpu_blocks_needed",
    "paper_stalls_s",
    "peak_buffer_blocks",
    "predict_step",
    "prefetch_buffer_blocks",
    "pruned_choice_bound",
    "pruned_choice_count",
    "simulate_step",
    "step_latency_s",
    "surrogate_latency_s",
    "surrogate_stalls_s",
]
