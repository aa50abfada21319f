"""Per-slice state of ServerlessService: one rho tuner per (GPU, slice). In
memory: after a restart each tuner starts again at rho 0, the conservative
start the policy uses for a newly activated model anyway."""

from __future__ import annotations

import threading

from planner.policies.serverless.tuner import (
    KnobDecision,
    KnobObservation,
    RhoTuner,
    TunerParams,
    TunerState,
)

MAX_TUNERS = 100_000


class ServerlessTuners:
    def __init__(self) -> None:
        self._tuners: dict[tuple[str, str], RhoTuner] = {}
        self._lock = threading.Lock()

    def _evict_if_full(self) -> None:
        if len(self._tuners) >= MAX_TUNERS:
            self._tuners.pop(next(iter(self._tuners)))

    def reset(self, gpu_id: str, slice_id: str, initial_rho: float) -> None:
        """A fresh tuner at initial_rho (a model switched onto the slice);
        the parameters of the previous tuner, if any, are kept."""
        with self._lock:
            old = self._tuners.get((gpu_id, slice_id))
            if old is None:
                self._evict_if_full()
            params = old.params if old is not None else None
            self._tuners[(gpu_id, slice_id)] = RhoTuner(params, initial_rho)

    def observe(
        self,
        gpu_id: str,
        slice_id: str,
        observation: KnobObservation,
        params: TunerParams | None,
    ) -> tuple[KnobDecision, TunerState]:
        with self._lock:
            tuner = self._tuners.get((gpu_id, slice_id))
            if tuner is None:
                self._evict_if_full()
                tuner = RhoTuner(params)
                self._tuners[(gpu_id, slice_id)] = tuner
            elif params is not None:
                params.check()
                tuner.params = params
            decision = tuner.observe(observation)
            return decision, tuner.state

    def params_of(self, gpu_id: str, slice_id: str) -> TunerParams:
        with self._lock:
            tuner = self._tuners.get((gpu_id, slice_id))
            return tuner.params if tuner is not None else TunerParams()

    def states(self, gpu_id: str) -> list[tuple[str, TunerState]]:
        with self._lock:
            return sorted(
                (slice_id, t.state) for (g, slice_id), t in self._tuners.items() if g == gpu_id
            )
