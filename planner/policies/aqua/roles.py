"""AQUA-PROFILER's roles (DESIGN.md §3.4): producer or consumer from a
deployment's measured profile.

- Non-LLM models: free GPU memory at the batch size where throughput
  saturates (the first batch size within `saturation_tolerance` of the
  curve's best throughput).
- LLMs: free memory at the highest SLA-sustainable request rate (TTFT and TBT
  within the SLA), found by a binary search over the rate range to within
  `rate_step_rps`, then a linear search in steps of `rate_step_rps` up (while
  sustainable) and, if the binary search's answer is not sustainable, down.
  The measured curve is the load -> (TTFT, TBT, memory) oracle, linear
  between points.
- LLMs without a measured curve (:func:`classify` with ``oracle=``, a
  callable the caller passes: the replay simulator,
  planner.replay.role_oracle, a pure seeded function). A rate is
  SLA-sustainable when TTFT and token-level TBT attainment are both >=
  ``attainment`` (default 0.9) against the deployment's SLOs. The search
  range defaults to [0.5, 64.5] RPS (width 64, so the binary search's probes
  land on the 0.5 RPS grid); the same binary + linear search then finds the
  largest multiple of 0.5 RPS that is sustainable (for a monotone oracle).
  Free memory = HBM - weights - peak GPU KV bytes at that rate (per GPU).

Producer when the free memory >= threshold (default 10 GB): R = free bytes.
Otherwise consumer with R = -swap_demand_bytes when it needs swap space, else
neutral (R = 0; the paper's "producer with 0 memory to offer").
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Protocol

from planner.domain.placement import (
    DeploymentProfile,
    RatePoint,
    Role,
    RoleConfig,
    RoleDecision,
)


def _interp(points: Sequence[RatePoint], rate: float) -> tuple[float, float, float]:
    """(ttft, tbt, used bytes) at rate, linear between points, clamped to
    the ends' values outside the curve."""
    pts = sorted(points, key=lambda p: p.rate_rps)
    if rate <= pts[0].rate_rps:
        p = pts[0]
        return p.ttft_s, p.tbt_s, float(p.used_bytes)
    for a, b in itertools.pairwise(pts):
        if rate <= b.rate_rps:
            t = (rate - a.rate_rps) / (b.rate_rps - a.rate_rps)
            return (
                a.ttft_s + t * (b.ttft_s - a.ttft_s),
                a.tbt_s + t * (b.tbt_s - a.tbt_s),
                a.used_bytes + t * (b.used_bytes - a.used_bytes),
            )
    # Past the last measured rate: latency grows without bound (queueing).
    return math.inf, math.inf, float(pts[-1].used_bytes)


DEFAULT_ATTAINMENT = 0.9
# The oracle's default search range (RPS) when RoleConfig gives 0, 0.
ORACLE_RATE_LOW_RPS = 0.5
ORACLE_RATE_HIGH_RPS = 64.5


class OraclePoint(Protocol):
    """What an oracle returns at one rate (planner.replay.oracle.LoadPoint)."""

    @property
    def ttft_attainment(self) -> float: ...
    @property
    def tbt_attainment(self) -> float: ...
    @property
    def peak_kv_bytes(self) -> int: ...
    @property
    def weight_bytes(self) -> int: ...
    @property
    def hbm_bytes(self) -> int: ...


Oracle = Callable[[float], OraclePoint]


def sustainable_rate(profile: DeploymentProfile, config: RoleConfig) -> tuple[float, list[float]]:
    """The highest rate meeting the SLA (0.0 when none) and the probes."""
    pts = profile.rate_curve
    low = config.rate_low_rps or min(p.rate_rps for p in pts)
    high = config.rate_high_rps or max(p.rate_rps for p in pts)

    def ok(rate: float) -> bool:
        ttft, tbt, _ = _interp(pts, rate)
        return ttft <= profile.slo_ttft_s and tbt <= profile.slo_tbt_s

    return search_rate(ok, low, high, config.rate_step_rps)


def search_rate(
    sustainable: Callable[[float], bool], low: float, high: float, step: float
) -> tuple[float, list[float]]:
    """Binary search over [low, high] to within step, then +step while
    sustainable: the highest sustainable rate (0.0 when low is not) and the
    probes in order."""
    probes: list[float] = []

    def ok(rate: float) -> bool:
        probes.append(rate)
        return sustainable(rate)

    if not ok(low):
        return 0.0, probes
    lo, hi = low, high
    if ok(hi):
        best = hi
    else:
        while hi - lo > step:
            mid = (lo + hi) / 2
            if ok(mid):
                lo = mid
            else:
                hi = mid
        best = lo
    # Linear search around it: +step while sustainable (a local maximum past a
    # non-monotone dip), within the search range.
    while best + step <= high + 1e-9 and ok(best + step):
        best += step
    return best, probes


def oracle_rate(
    oracle: Oracle, config: RoleConfig, attainment: float = DEFAULT_ATTAINMENT
) -> tuple[float, list[float], OraclePoint | None]:
    """The highest rate whose oracle point meets `attainment` for both TTFT
    and TBT, the probes, and the point there (None when no rate is)."""
    if not 0 < attainment <= 1:
        raise ValueError(f"attainment: must be in (0, 1], got {attainment}")
    low = config.rate_low_rps or ORACLE_RATE_LOW_RPS
    high = config.rate_high_rps or ORACLE_RATE_HIGH_RPS
    seen: dict[float, OraclePoint] = {}

    def point(rate: float) -> OraclePoint:
        if rate not in seen:
            seen[rate] = oracle(rate)
        return seen[rate]

    def ok(rate: float) -> bool:
        p = point(rate)
        return p.ttft_attainment >= attainment and p.tbt_attainment >= attainment

    rate, probes = search_rate(ok, low, high, config.rate_step_rps)
    return rate, probes, (point(rate) if rate > 0 else None)


def classify(
    profile: DeploymentProfile,
    config: RoleConfig | None = None,
    *,
    oracle: Oracle | None = None,
    attainment: float = DEFAULT_ATTAINMENT,
) -> RoleDecision:
    """`oracle` (rate -> point) stands for the LLM's curve when the profile
    has neither a rate nor a batch curve."""
    config = config or RoleConfig()
    batch_size = 0
    rate = 0.0
    probes: list[float] = []
    if oracle is not None and not profile.is_llm and not profile.batch_curve:
        rate, probes, at = oracle_rate(oracle, config, attainment)
        if at is not None:
            free = max(0, at.hbm_bytes - at.weight_bytes - at.peak_kv_bytes)
            used = float(profile.gpu_memory_bytes - free)
            why = (
                f"replay sustains {rate:g} RPS at >= {attainment:g} TTFT/TBT attainment "
                f"(peak KV {at.peak_kv_bytes} bytes, weights {at.weight_bytes})"
            )
        else:
            used = float(profile.gpu_memory_bytes)
            why = f"replay meets {attainment:g} attainment at no rate"
    elif profile.is_llm:
        rate, probes = sustainable_rate(profile, config)
        if rate > 0:
            used = _interp(profile.rate_curve, rate)[2]
            why = f"sustains {rate:g} RPS within the SLA"
        else:
            used = float(profile.gpu_memory_bytes)
            why = "no rate of the curve meets the SLA"
    elif profile.batch_curve:
        best = max(p.throughput for p in profile.batch_curve)
        pts = sorted(profile.batch_curve, key=lambda p: p.batch_size)
        sat = next(p for p in pts if p.throughput >= (1 - config.saturation_tolerance) * best)
        batch_size, used = sat.batch_size, float(sat.used_bytes)
        why = f"throughput saturates at batch size {batch_size}"
    else:
        raise ValueError(f"deployment {profile.id!r}: no batch_curve or rate_curve")
    free = max(0, round(profile.gpu_memory_bytes - used))
    if free >= config.threshold_bytes:
        role, r = Role.PRODUCER, free
    elif profile.swap_demand_bytes > 0:
        role, r = Role.CONSUMER, -profile.swap_demand_bytes
    else:
        role, r = Role.NEUTRAL, 0
    return RoleDecision(
        id=profile.id,
        role=role,
        r_bytes=r,
        free_bytes=free,
        batch_size=batch_size,
        sustainable_rate_rps=rate,
        probes_rps=tuple(probes),
        reason=f"{why}; {free} bytes free (threshold {config.threshold_bytes})",
    )
