"""The HybridGEMM knob controller (C2CServe §7, DESIGN.md §3.5): one per
active slice, its whole state explicit (:class:`TunerState`), the update a
pure function (:func:`tune`) of the state, one observation and the
parameters; time is passed in.

Every control interval the measured GEMM latency, HBM utilization and C2C
utilization are smoothed by an EWMA. At a layer or request boundary (never
inside a kernel) the imbalance ``u_c2c - u_hbm`` decides: above theta, rho
goes down (more weight-stationary, less C2C); below -theta, rho goes up
(more output-stationary, less HBM); within the band, rho stays. The step is
latency-aware (``step_large`` while the smoothed latency misses its budget,
``step_small`` otherwise), halved each time the direction reverses (so the
loop cannot limit-cycle around the balance point with a fixed step), doubled
back after ``recover_after`` moves the same way, bounded by ``max_step``
and ``min_step``; rho is clamped to ``[rho_min, rho_max]``.

Stated band: after a step change in co-tenant link load, once the tuner has
settled, rho moves by at most 0.02 (default parameters, theta > 0: it stops
inside the theta band) or by at most 3 x min_step (theta = 0: the EWMA's lag
leaves a small cycle); tests/policies/test_serverless_tuner.py checks both
in closed loop on the C2C cost model, and that a fixed step limit-cycles.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class TunerParams:
    ewma_alpha: float = 0.3
    theta: float = 0.05
    step_small: float = 0.02
    step_large: float = 0.08
    max_step: float = 0.1
    min_step: float = 0.005
    rho_min: float = 0.0
    rho_max: float = 1.0
    # Moves the same way before a halved step doubles back.
    recover_after: int = 5
    # Least time between two updates (0: every boundary may update).
    min_interval_s: float = 0.0

    def check(self) -> None:
        """Raises ValueError naming the first bad parameter."""
        if not 0.0 < self.ewma_alpha <= 1.0:
            raise ValueError(f"ewma_alpha: must be in (0, 1], got {self.ewma_alpha}")
        if not 0.0 <= self.theta < 1.0:
            raise ValueError(f"theta: must be in [0, 1), got {self.theta}")
        for name in ("step_small", "step_large", "max_step", "min_step"):
            v = getattr(self, name)
            if not (math.isfinite(v) and 0.0 < v <= 1.0):
                raise ValueError(f"{name}: must be in (0, 1], got {v}")
        if self.min_step > self.max_step:
            raise ValueError(
                f"min_step: must be <= max_step ({self.max_step}), got {self.min_step}"
            )
        if not 0.0 <= self.rho_min <= 1.0:
            raise ValueError(f"rho_min: must be in [0, 1], got {self.rho_min}")
        if not self.rho_min <= self.rho_max <= 1.0:
            raise ValueError(f"rho_max: must be in [rho_min={self.rho_min}, 1], got {self.rho_max}")
        if self.recover_after < 1:
            raise ValueError(f"recover_after: must be >= 1, got {self.recover_after}")
        if not (math.isfinite(self.min_interval_s) and self.min_interval_s >= 0):
            raise ValueError(f"min_interval_s: must be >= 0, got {self.min_interval_s}")


@dataclass(frozen=True, slots=True)
class TunerState:
    """Everything the tuner remembers (serializable with :meth:`to_dict`)."""

    rho: float = 0.0
    # EWMAs (meaningful once samples > 0).
    latency_s: float = 0.0
    hbm_util: float = 0.0
    c2c_util: float = 0.0
    samples: int = 0
    updates: int = 0
    # The last update's time and direction (-1 down, +1 up, 0 none yet).
    last_update_s: float = -math.inf
    last_direction: int = 0
    # Multiplier of the step (halved on reversal, doubled back after
    # recover_after moves the same way), and that run's length.
    step_scale: float = 1.0
    same_direction: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> TunerState:
        return TunerState(**data)


@dataclass(frozen=True, slots=True)
class KnobObservation:
    now_s: float
    # Measured GEMM latency and its budget (the request's TTFT/TPOT target
    # spread over the model's GEMMs).
    latency_s: float
    latency_budget_s: float
    # Utilizations normalized by the slice's HBM bandwidth and the link's.
    hbm_util: float
    c2c_util: float
    # At a layer or request boundary: rho may change now.
    at_boundary: bool = True


@dataclass(frozen=True, slots=True)
class KnobDecision:
    rho: float
    changed: bool
    # -1 down, +1 up, 0 held.
    direction: int
    step: float
    imbalance: float
    over_budget: bool
    reason: str


def tune(
    state: TunerState, obs: KnobObservation, params: TunerParams
) -> tuple[TunerState, KnobDecision]:
    """One control interval: smooth, then (at a boundary) maybe move rho."""
    a = params.ewma_alpha
    if state.samples == 0:
        lat, hbm, c2c = obs.latency_s, obs.hbm_util, obs.c2c_util
    else:
        lat = a * obs.latency_s + (1 - a) * state.latency_s
        hbm = a * obs.hbm_util + (1 - a) * state.hbm_util
        c2c = a * obs.c2c_util + (1 - a) * state.c2c_util
    smoothed = replace(state, latency_s=lat, hbm_util=hbm, c2c_util=c2c, samples=state.samples + 1)
    imbalance = c2c - hbm
    over = lat > obs.latency_budget_s

    def hold(reason: str) -> tuple[TunerState, KnobDecision]:
        return smoothed, KnobDecision(smoothed.rho, False, 0, 0.0, imbalance, over, reason)

    if not obs.at_boundary:
        return hold("not at a layer or request boundary: rho changes only there")
    if obs.now_s - state.last_update_s < params.min_interval_s:
        return hold(f"within min_interval_s of the last update ({state.last_update_s:g} s)")
    if abs(imbalance) <= params.theta:
        return hold(f"balanced: |u_c2c - u_hbm| = {abs(imbalance):.3f} <= theta {params.theta:g}")
    direction = -1 if imbalance > 0 else 1
    scale, run = state.step_scale, state.same_direction
    if state.last_direction == -direction:
        scale, run = scale / 2, 1
    else:
        run += 1
        if run > params.recover_after and scale < 1.0:
            scale, run = min(1.0, scale * 2), 1
    base = params.step_large if over else params.step_small
    step = min(params.max_step, max(params.min_step, base * scale))
    # Do not let the scale fall past the point where min_step binds anyway.
    scale = max(scale, params.min_step / base)
    rho = min(params.rho_max, max(params.rho_min, state.rho + direction * step))
    moved = rho != state.rho
    why = (
        "C2C more saturated: toward weight-stationary"
        if direction < 0
        else ("HBM more saturated: toward output-stationary")
    )
    if not moved:
        why += f"; clamped at {rho:g}"
    elif over:
        why += f"; latency {lat:.3g} s over budget {obs.latency_budget_s:.3g} s: large step"
    new = replace(
        smoothed,
        rho=rho,
        updates=state.updates + (1 if moved else 0),
        last_update_s=obs.now_s,
        last_direction=direction,
        step_scale=scale,
        same_direction=run,
    )
    return new, KnobDecision(rho, moved, direction if moved else 0, step, imbalance, over, why)


class RhoTuner:
    """A tuner holding its state: the object the service keeps per slice."""

    def __init__(self, params: TunerParams | None = None, initial_rho: float = 0.0) -> None:
        self.params = params or TunerParams()
        self.params.check()
        rho = min(self.params.rho_max, max(self.params.rho_min, initial_rho))
        self.state = TunerState(rho=rho)

    def observe(self, obs: KnobObservation) -> KnobDecision:
        self.state, decision = tune(self.state, obs, self.params)
        return decision
