"""Arrival times: a renewal process (Poisson or Gamma gaps) driven by a
piecewise-constant rate schedule.

Burstiness is the coefficient of variation (CV = std / mean) of the gaps
between arrivals: CV 1 is Poisson (exponential gaps), CV > 1 burstier, CV < 1
smoother, CV 0 evenly spaced. Gaps are Gamma(shape 1/CV², mean 1/rate).

A rate schedule is exact by time rescaling: with Λ(t) = ∫₀ᵗ λ(u) du, the
process draws arrivals τ₁ < τ₂ < ... of a unit-rate renewal process with the
requested CV and maps each to t = Λ⁻¹(τ). For CV 1 this is exactly the
inhomogeneous Poisson process with rate λ(t); for other CVs it is the
renewal process whose gap CV is the requested one at every rate (measured in
operational time), the standard "time-rescaled" renewal process.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from planner.trace.errors import SpecError

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class RateSchedule:
    """λ(t) = rates_rps[i] for starts_s[i] <= t < starts_s[i + 1]; the last
    rate holds forever. starts_s[0] is 0."""

    starts_s: tuple[float, ...]
    rates_rps: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.starts_s or len(self.starts_s) != len(self.rates_rps):
            raise SpecError("--rate-schedule", "needs one rate per start time")
        if self.starts_s[0] != 0:
            raise SpecError("--rate-schedule", f"must start at 0 s, starts at {self.starts_s[0]}")
        for a, b in itertools.pairwise(self.starts_s):
            if not b > a:
                raise SpecError("--rate-schedule", f"start times must increase: {b} after {a}")
        for start in self.starts_s:
            if not math.isfinite(start):
                raise SpecError("--rate-schedule", f"start times must be finite, got {start}")
        for rate in self.rates_rps:
            if not (math.isfinite(rate) and rate >= 0):
                raise SpecError("--rate-schedule", f"rates must be finite and >= 0, got {rate}")
        if not any(rate > 0 for rate in self.rates_rps):
            raise SpecError("--rate-schedule", "needs at least one rate > 0")

    @classmethod
    def constant(cls, rate_rps: float) -> RateSchedule:
        if not (math.isfinite(rate_rps) and rate_rps > 0):
            raise SpecError("--rate", f"must be a finite number > 0, got {rate_rps}")
        return cls((0.0,), (float(rate_rps),))

    @classmethod
    def parse(cls, text: str) -> RateSchedule:
        """ "0:5,60:20,90:5" → 5 rps from 0 s, 20 rps from 60 s, 5 rps from 90 s."""
        starts: list[float] = []
        rates: list[float] = []
        for part in text.split(","):
            start, sep, rate = part.strip().partition(":")
            try:
                if not sep:
                    raise ValueError
                starts.append(float(start))
                rates.append(float(rate))
            except ValueError:
                raise SpecError(
                    "--rate-schedule",
                    f"expected START_S:RATE_RPS pairs like 0:5,60:20,90:5, got {part.strip()!r}",
                ) from None
        return cls(tuple(starts), tuple(rates))

    @property
    def ends_at_zero(self) -> bool:
        return self.rates_rps[-1] == 0

    def _cumulative_at_starts(self) -> FloatArray:
        starts = np.asarray(self.starts_s, dtype=np.float64)
        rates = np.asarray(self.rates_rps, dtype=np.float64)
        return np.concatenate(([0.0], np.cumsum(np.diff(starts) * rates[:-1])))

    def cumulative(self, t_s: float) -> float:
        """Λ(t): the expected number of arrivals in [0, t)."""
        cum = self._cumulative_at_starts()
        i = int(np.searchsorted(np.asarray(self.starts_s), t_s, side="right")) - 1
        i = max(i, 0)
        return float(cum[i] + (t_s - self.starts_s[i]) * self.rates_rps[i])

    def inverse(self, tau: FloatArray) -> FloatArray:
        """Λ⁻¹(τ) for non-decreasing τ >= 0; inf beyond a final zero rate."""
        cum = self._cumulative_at_starts()
        starts = np.asarray(self.starts_s, dtype=np.float64)
        rates = np.asarray(self.rates_rps, dtype=np.float64)
        # The segment whose [Λ(start), Λ(next start)) holds τ; a zero-rate
        # segment has an empty range and is never chosen except the last.
        seg = np.searchsorted(cum, tau, side="right") - 1
        seg = np.clip(seg, 0, len(starts) - 1)
        rate = rates[seg]
        with np.errstate(divide="ignore", invalid="ignore"):
            t = starts[seg] + (tau - cum[seg]) / rate
        return np.where(rate > 0, t, np.inf)

    def describe(self) -> str:
        if len(self.rates_rps) == 1:
            return f"{self.rates_rps[0]:g} rps"
        return ",".join(f"{s:g}:{r:g}" for s, r in zip(self.starts_s, self.rates_rps, strict=True))


def unit_gaps(rng: np.random.Generator, n: int, cv: float) -> FloatArray:
    """n gaps of mean 1 and coefficient of variation cv."""
    if cv == 0:
        return np.ones(n, dtype=np.float64)
    shape = 1.0 / (cv * cv)
    return rng.standard_gamma(shape, n) / shape


def check_burstiness(cv: float) -> float:
    if not (math.isfinite(cv) and cv >= 0):
        raise SpecError("--burstiness", f"must be a finite number >= 0, got {cv}")
    return float(cv)


def arrival_times(
    schedule: RateSchedule,
    cv: float,
    rng: np.random.Generator,
    *,
    duration_s: float | None = None,
    num_requests: int | None = None,
) -> FloatArray:
    """Arrival times in seconds, increasing, first one after 0: all those
    before duration_s, or the first num_requests, or whichever ends first
    when both are given (at least one must be)."""
    check_burstiness(cv)
    if duration_s is None and num_requests is None:
        raise SpecError("--duration", "give --duration or --num-requests (or both)")
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise SpecError("--duration", f"must be a finite number > 0, got {duration_s}")
    if num_requests is not None and num_requests < 1:
        raise SpecError("--num-requests", f"must be >= 1, got {num_requests}")
    if duration_s is None and schedule.ends_at_zero:
        raise SpecError("--rate-schedule", "a schedule that ends at rate 0 needs --duration")
    if num_requests is not None:
        tau = np.cumsum(unit_gaps(rng, num_requests, cv))
    else:
        assert duration_s is not None
        tau = _operational_times_until(schedule.cumulative(duration_s), cv, rng)
    times = schedule.inverse(tau)
    if duration_s is not None:
        times = times[times < duration_s]
    return times


def _operational_times_until(limit: float, cv: float, rng: np.random.Generator) -> FloatArray:
    """Unit-rate renewal arrivals up to (at least) `limit`, drawn in chunks
    whose sizes depend only on `limit` and cv, so a seed fixes the result."""
    chunk = max(64, int(limit + 6.0 * math.sqrt(limit) * max(cv, 1.0)) + 16)
    parts: list[FloatArray] = []
    last = 0.0
    while last <= limit:
        part = last + np.cumsum(unit_gaps(rng, chunk, cv))
        parts.append(part)
        last = float(part[-1])
    return np.concatenate(parts)
