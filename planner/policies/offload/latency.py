"""Decode step latency of a layer-offload placement under a chosen model
(DESIGN.md §3.2): "exact" (the event model, the default), "paper" (OrbitFlow
Algorithm 1 literally) or "surrogate" (the ILP's linear bound)."""

from __future__ import annotations

import enum

import numpy.typing as npt

from planner.policies.offload import event_model, paper_model, surrogate
from planner.policies.offload.step import StepInputs, StepTimeline


class LatencyModel(enum.StrEnum):
    EXACT = "exact"
    PAPER = "paper"
    SURROGATE = "surrogate"


def predict_step(
    inputs: StepInputs, model: LatencyModel | str = LatencyModel.EXACT
) -> StepTimeline:
    """The timeline `model` predicts for one decode step."""
    match LatencyModel(model):
        case LatencyModel.EXACT:
            return event_model.simulate_step(inputs)
        case LatencyModel.PAPER:
            return paper_model.paper_timeline(inputs)
        case LatencyModel.SURROGATE:
            return surrogate.surrogate_timeline(inputs)


def step_latency_s(
    comp_s: npt.ArrayLike,
    kv_blocks: npt.ArrayLike,
    resident: npt.ArrayLike,
    bandwidth_blocks_per_s: float,
    *,
    model: LatencyModel | str = LatencyModel.EXACT,
) -> float:
    """Predicted decode step latency of one placement.

    comp_s (L,) per-layer compute, kv_blocks (R,) blocks per layer of each
    request, resident (R, L) True = on GPU, bandwidth in blocks per second.
    """
    inputs = StepInputs.of(comp_s, kv_blocks, resident, bandwidth_blocks_per_s)
    match LatencyModel(model):
        case LatencyModel.EXACT:
            return event_model.step_latency_s(inputs)
        case LatencyModel.PAPER:
            return paper_model.paper_latency_s(inputs)
        case LatencyModel.SURROGATE:
            return float(
                surrogate.surrogate_latency_s(
                    inputs.comp_s, inputs.kv_blocks, inputs.resident, bandwidth_blocks_per_s
                )
            )
