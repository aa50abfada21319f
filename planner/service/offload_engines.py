"""Per-engine state of OffloadService: each engine's adaptive controller and
its last plan (the next solve's warm start). In memory: an engine that finds
the server restarted gets REPLAN_REASON_NO_PLAN and simply asks again."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass

import numpy as np

from planner.domain.offload import DecodeBatch, OffloadInputs, OffloadPlan
from planner.policies.offload.controller import (
    AdaptiveController,
    ControllerDecision,
    StepObservation,
)
from planner.policies.offload.placement import plan_layer_offload

MAX_ENGINES = 10_000


@dataclass
class _Engine:
    controller: AdaptiveController
    plan: OffloadPlan | None = None


class OffloadEngines:
    def __init__(self) -> None:
        self._engines: dict[str, _Engine] = {}
        self._lock = threading.Lock()

    def plan(
        self, engine_id: str, batch: DecodeBatch, inputs: OffloadInputs, step: int
    ) -> OffloadPlan:
        """A plan; for a named engine its refreshed estimates replace the
        request's once it has any, and the plan is installed."""
        if not engine_id:
            return plan_layer_offload(batch, inputs, step=step)
        with self._lock:
            engine = self._engines.get(engine_id)
            if engine is None or len(engine.controller.comp_s) != inputs.num_layers:
                if engine is None and len(self._engines) >= MAX_ENGINES:
                    self._engines.pop(next(iter(self._engines)))
                engine = _Engine(
                    AdaptiveController(
                        comp_s=inputs.layer_compute_s.tolist(),
                        bandwidth_blocks_per_s=inputs.link_blocks_per_s,
                    )
                )
                self._engines[engine_id] = engine
            else:
                inputs = dataclasses.replace(
                    inputs,
                    layer_compute_s=np.array(engine.controller.comp_s),
                    link_blocks_per_s=engine.controller.bandwidth_blocks_per_s,
                )
            previous = engine.plan
        plan = plan_layer_offload(batch, inputs, step=step, previous=previous)
        with self._lock:
            engine.plan = plan
            engine.controller.install_plan(
                [p.id for p in plan.placements], plan.predicted_step_s, plan.expiry_step
            )
        return plan

    def report(self, engine_id: str, observation: StepObservation) -> ControllerDecision | None:
        """The controller's decision; None when the engine has no plan here."""
        with self._lock:
            engine = self._engines.get(engine_id)
            if engine is None:
                return None
            return engine.controller.observe(observation)


def warm_up() -> None:
    """One tiny plan, so that the first real call does not pay for loading
    the solver library (OR-Tools takes ~0.5 s on first use)."""
    batch = DecodeBatch(
        ids=("warm-up",),
        num_tokens=np.array([64], np.int64),
        deposited_tokens=np.zeros(1, np.int64),
        slo_tbt_s=np.array([0.1]),
        paused=np.zeros(1, np.bool_),
        steps_left=np.array([-1], np.int64),
    )
    inputs = OffloadInputs(
        layer_compute_s=np.full(4, 1e-3), link_blocks_per_s=1e5, gpu_block_budget=10
    )
    plan_layer_offload(batch, inputs)
