"""Seeded run-to-run variation of iteration times. Real engines do not take
exactly the modelled time per iteration (kernel choice, clocks, other
tenants); a replay with jitter shows how sensitive a policy's attainment is
to that, and --seed makes every such run reproducible."""

from __future__ import annotations

import math

import numpy as np

from planner.replay.models import IterationCost


class JitteredCost:
    """Multiplies each iteration's modelled time by an independent lognormal
    factor with mean 1 and the given coefficient of variation. Draws come in
    blocks from a generator seeded once, so a run is deterministic for a
    seed."""

    _BLOCK = 4096

    def __init__(self, base: IterationCost, cv: float, seed: int) -> None:
        if not (math.isfinite(cv) and cv >= 0):
            raise ValueError(f"jitter cv must be a finite number >= 0, got {cv}")
        self.base = base
        self.cv = cv
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        sigma2 = math.log1p(cv * cv)
        self._sigma = math.sqrt(sigma2)
        self._mu = -sigma2 / 2
        self._factors: list[float] = []

    def iteration_time_s(
        self, prefill_tokens: int, decode_tokens: int, attended_context_tokens: int
    ) -> float:
        base = self.base.iteration_time_s(prefill_tokens, decode_tokens, attended_context_tokens)
        if base == 0.0 or self.cv == 0.0:
            return base
        if not self._factors:
            draws = self._rng.lognormal(self._mu, self._sigma, self._BLOCK)
            self._factors = draws.tolist()[::-1]
        return base * self._factors.pop()
