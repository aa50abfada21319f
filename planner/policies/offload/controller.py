"""OrbitFlow's Adaptive Controller: when to re-plan (DESIGN.md §3.2; OrbitFlow
§3.4 "Solver Invocations").

A plan is re-requested when the batch differs from the one it was made for,
when the next step reaches the plan's expiry step (the end of its decode
window), or when the observed step latency differs from the prediction by
more than a fraction of the prediction. In the last case the per-layer compute
times and the link bandwidth are first refreshed by an exponentially weighted
moving average: estimate <- (1 - w) * estimate + w * observed. An observation
without per-layer compute times or bandwidth scales the compute estimates by
(1 - w) + w * observed / predicted instead (the only signal there is).

The whole state is explicit (to_dict / from_dict); the caller passes step
indices, the controller reads no clock.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any


class ReplanReason(enum.StrEnum):
    """Why a new plan is needed, in the order reported."""

    NO_PLAN = "no_plan"
    BATCH_CHANGE = "batch_change"
    PROFILE_MISMATCH = "profile_mismatch"
    EXPIRY = "expiry"


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """mismatch_fraction: re-plan when |observed - predicted| exceeds this
    fraction of predicted. ewma_weight: weight w of a new observation."""

    mismatch_fraction: float = 0.2
    ewma_weight: float = 0.5

    def __post_init__(self) -> None:
        if not self.mismatch_fraction >= 0:
            raise ValueError(f"mismatch_fraction must be >= 0, got {self.mismatch_fraction}")
        if not 0 < self.ewma_weight <= 1:
            raise ValueError(f"ewma_weight must be in (0, 1], got {self.ewma_weight}")


@dataclass(frozen=True, slots=True)
class StepObservation:
    """What the executor saw after decode step `step`.

    request_ids: the batch the next step will run.
    observed_step_s: the step's measured latency.
    predicted_step_s: the plan's prediction for this step when the caller
        re-evaluated it (KV grew since planning); else the plan's own.
    layer_comp_s / bandwidth_blocks_per_s: measured, when available.
    """

    step: int
    request_ids: Collection[str]
    observed_step_s: float
    predicted_step_s: float | None = None
    layer_comp_s: Sequence[float] | None = None
    bandwidth_blocks_per_s: float | None = None


@dataclass(frozen=True, slots=True)
class ControllerDecision:
    """reason: the first of reasons, None when the plan still holds."""

    reasons: tuple[ReplanReason, ...]
    comp_s: tuple[float, ...]
    bandwidth_blocks_per_s: float
    profile_updated: bool

    @property
    def reason(self) -> ReplanReason | None:
        return self.reasons[0] if self.reasons else None

    @property
    def replan(self) -> bool:
        return bool(self.reasons)


@dataclass(slots=True)
class AdaptiveController:
    """Profile estimates plus the installed plan's batch, prediction and
    expiry."""

    comp_s: list[float]
    bandwidth_blocks_per_s: float
    config: ControllerConfig = field(default_factory=ControllerConfig)
    plan_request_ids: frozenset[str] | None = None
    plan_predicted_step_s: float | None = None
    plan_expiry_step: int | None = None

    def install_plan(
        self, request_ids: Collection[str], predicted_step_s: float, expiry_step: int
    ) -> None:
        """A plan for request_ids is in force until step expiry_step (the first
        step it does not cover)."""
        self.plan_request_ids = frozenset(request_ids)
        self.plan_predicted_step_s = predicted_step_s
        self.plan_expiry_step = expiry_step

    def observe(self, observation: StepObservation) -> ControllerDecision:
        """Whether to re-plan after a step, refreshing the profile on a
        mismatch."""
        reasons: list[ReplanReason] = []
        updated = False
        if self.plan_request_ids is None:
            reasons.append(ReplanReason.NO_PLAN)
        else:
            if frozenset(observation.request_ids) != self.plan_request_ids:
                reasons.append(ReplanReason.BATCH_CHANGE)
            predicted = observation.predicted_step_s
            if predicted is None:
                predicted = self.plan_predicted_step_s
            if predicted is not None and self._mismatch(observation.observed_step_s, predicted):
                reasons.append(ReplanReason.PROFILE_MISMATCH)
                self._update_profile(observation, predicted)
                updated = True
            if self.plan_expiry_step is not None and observation.step + 1 >= self.plan_expiry_step:
                reasons.append(ReplanReason.EXPIRY)
        return ControllerDecision(
            reasons=tuple(reasons),
            comp_s=tuple(self.comp_s),
            bandwidth_blocks_per_s=self.bandwidth_blocks_per_s,
            profile_updated=updated,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "comp_s": list(self.comp_s),
            "bandwidth_blocks_per_s": self.bandwidth_blocks_per_s,
            "mismatch_fraction": self.config.mismatch_fraction,
            "ewma_weight": self.config.ewma_weight,
            "plan_request_ids": (
                None if self.plan_request_ids is None else sorted(self.plan_request_ids)
            ),
            "plan_predicted_step_s": self.plan_predicted_step_s,
            "plan_expiry_step": self.plan_expiry_step,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AdaptiveController:
        ids = data["plan_request_ids"]
        predicted = data["plan_predicted_step_s"]
        expiry = data["plan_expiry_step"]
        return cls(
            comp_s=[float(c) for c in data["comp_s"]],
            bandwidth_blocks_per_s=float(data["bandwidth_blocks_per_s"]),
            config=ControllerConfig(
                mismatch_fraction=float(data["mismatch_fraction"]),
                ewma_weight=float(data["ewma_weight"]),
            ),
            plan_request_ids=None if ids is None else frozenset(str(i) for i in ids),
            plan_predicted_step_s=None if predicted is None else float(predicted),
            plan_expiry_step=None if expiry is None else int(expiry),
        )

    def _mismatch(self, observed_s: float, predicted_s: float) -> bool:
        return abs(observed_s - predicted_s) > self.config.mismatch_fraction * predicted_s

    def _update_profile(self, observation: StepObservation, predicted_s: float) -> None:
        w = self.config.ewma_weight
        layer_comp = observation.layer_comp_s
        bandwidth = observation.bandwidth_blocks_per_s
        if layer_comp is not None:
            if len(layer_comp) != len(self.comp_s):
                raise ValueError(
                    f"layer_comp_s has {len(layer_comp)} layers, the profile {len(self.comp_s)}"
                )
            self.comp_s = [
                (1 - w) * c + w * o for c, o in zip(self.comp_s, layer_comp, strict=True)
            ]
        if bandwidth is not None:
            self.bandwidth_blocks_per_s = (1 - w) * self.bandwidth_blocks_per_s + w * bandwidth
        if layer_comp is None and bandwidth is None and predicted_s > 0:
            scale = (1 - w) + w * observation.observed_step_s / predicted_s
            self.comp_s = [c * scale for c in self.comp_s]
