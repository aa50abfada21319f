"""Seeded run-to-run variation of iteration times. Real engines do not take
exactly the modelled time per iteration (kernel choice, clocks, other
tenants); a replay with jitter shows how sensitive a policy's attainment is
to that, and --seed makes every such run reproducible."""

from __future__ import annotations

import math

import numpy as np

from planner.replay.models import AttentionPairsCost, IterationCost


class JitterFactors:
    """Independent lognormal factors with mean 1 and the given coefficient
    of variation. Draws come in blocks from a generator seeded once, so a
    run is deterministic for a seed."""

    _BLOCK = 4096

    def __init__(self, cv: float, seed: int) -> None:
        if not (math.isfinite(cv) and cv >= 0):
            raise ValueError(f"jitter cv must be a finite number >= 0, got {cv}")
        self.cv = cv
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        sigma2 = math.log1p(cv * cv)
        self._sigma = math.sqrt(sigma2)
        self._mu = -sigma2 / 2
        self._factors: list[float] = []

    def apply(self, time_s: float) -> float:
        """time_s times the next factor; a zero time or cv draws none."""
        if time_s == 0.0 or self.cv == 0.0:
            return time_s
        if not self._factors:
            draws = self._rng.lognormal(self._mu, self._sigma, self._BLOCK)
            self._factors = draws.tolist()[::-1]
        return time_s * self._factors.pop()


class JitteredCost:
    """Multiplies each iteration's modelled time by the next of its
    JitterFactors."""

    def __init__(self, base: IterationCost, cv: float, seed: int) -> None:
        self.base = base
        self.factors = JitterFactors(cv, seed)
        self.cv = cv
        self.seed = seed

    def iteration_time_s(
        self, prefill_tokens: int, decode_tokens: int, attended_context_tokens: int
    ) -> float:
        return self.factors.apply(
            self.base.iteration_time_s(prefill_tokens, decode_tokens, attended_context_tokens)
        )


class JitteredAttentionPairsCost:
    """JitteredCost for a cost model that also charges the prefill's causal
    attention pairs (the cluster topology's instances)."""

    def __init__(self, base: AttentionPairsCost, cv: float, seed: int) -> None:
        self.base = base
        self.factors = JitterFactors(cv, seed)
        self.cv = cv
        self.seed = seed

    def iteration_time_s(
        self,
        prefill_tokens: int,
        decode_tokens: int,
        attended_context_tokens: int,
        prefill_attention_pairs: int = 0,
    ) -> float:
        return self.factors.apply(
            self.base.iteration_time_s(
                prefill_tokens, decode_tokens, attended_context_tokens, prefill_attention_pairs
            )
        )
