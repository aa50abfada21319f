"""AQUA-PROFILER roles on hand-made curves."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from planner.domain.placement import (
    BatchPoint,
    DeploymentProfile,
    RatePoint,
    Role,
    RoleConfig,
)
from planner.policies.aqua.roles import classify, oracle_rate, sustainable_rate
from planner.replay.role_oracle import classify_by_replay

GB = 10**9


def test_non_llm_free_memory_where_throughput_saturates():
    # Stable-diffusion-like: throughput flattens at batch 8 with 50 GB used of 80.
    curve = tuple(
        BatchPoint(b, t, u * GB)
        for b, t, u in [(1, 1.0, 20), (2, 1.9, 25), (4, 3.5, 35), (8, 5.0, 50), (16, 5.1, 70)]
    )
    d = classify(DeploymentProfile("sd3", 80 * GB, batch_curve=curve))
    assert d.batch_size == 8
    assert d.free_bytes == 30 * GB
    assert d.role is Role.PRODUCER and d.r_bytes == 30 * GB


def test_llm_free_memory_at_the_highest_sustainable_rate():
    # TTFT passes 1 s between 5 and 6 RPS (interpolated: 5.5 RPS is 1.0 s).
    curve = tuple(
        RatePoint(r, ttft, 0.05, u * GB)
        for r, ttft, u in [(1, 0.2, 30), (3, 0.4, 45), (5, 0.8, 55), (6, 1.2, 70), (10, 6.0, 78)]
    )
    profile = DeploymentProfile("llama8b", 80 * GB, rate_curve=curve, slo_ttft_s=1.0)
    rate, probes = sustainable_rate(profile, RoleConfig())
    assert rate == 5.5  # binary search lands in [5, 5.5], linear search steps up to 5.5
    assert probes[:2] == [1, 10]
    d = classify(profile)
    assert d.sustainable_rate_rps == 5.5
    assert d.free_bytes == round(80 * GB - 62.5 * GB)
    assert d.role is Role.PRODUCER


def test_linear_search_finds_a_local_maximum_past_a_dip():
    # TBT violates at 4 RPS only (a measured dip); 4.5 and 5 are fine again.
    curve = tuple(
        RatePoint(r, 0.1, tbt, 40 * GB)
        for r, tbt in [(1, 0.05), (3.5, 0.09), (4, 0.2), (4.5, 0.09), (5, 0.09), (8, 0.5)]
    )
    profile = DeploymentProfile("dip", 80 * GB, rate_curve=curve)
    rate, _ = sustainable_rate(profile, RoleConfig(rate_step_rps=0.5))
    assert rate >= 3.5


def test_consumer_and_neutral():
    curve = (RatePoint(1, 0.5, 0.05, 75 * GB), RatePoint(4, 3.0, 0.2, 79 * GB))
    consumer = classify(
        DeploymentProfile("yi34b", 80 * GB, rate_curve=curve, swap_demand_bytes=15 * GB)
    )
    assert consumer.role is Role.CONSUMER and consumer.r_bytes == -15 * GB
    neutral = classify(DeploymentProfile("x", 80 * GB, rate_curve=curve))
    assert neutral.role is Role.NEUTRAL and neutral.r_bytes == 0
    # Nothing sustainable: no memory is free.
    hopeless = (RatePoint(1, 5.0, 0.05, 40 * GB), RatePoint(2, 9.0, 0.05, 41 * GB))
    d = classify(DeploymentProfile("h", 80 * GB, rate_curve=hopeless, swap_demand_bytes=GB))
    assert d.sustainable_rate_rps == 0 and d.free_bytes == 0 and d.role is Role.CONSUMER
    # Threshold: 5 GB free is a producer only below a 5 GB threshold.
    small = (BatchPoint(1, 1.0, 75 * GB),)
    assert classify(DeploymentProfile("s", 80 * GB, batch_curve=small)).role is Role.NEUTRAL
    low = RoleConfig(threshold_bytes=5 * GB)
    assert classify(DeploymentProfile("s", 80 * GB, batch_curve=small), low).role is Role.PRODUCER


# --- The replay simulator as the oracle (no measured curve) -----------------


@dataclass(frozen=True)
class _Point:
    ttft_attainment: float
    tbt_attainment: float
    peak_kv_bytes: int
    weight_bytes: int = 16 * GB
    hbm_bytes: int = 80 * GB


def test_binary_then_linear_search_finds_the_documented_rate_on_a_fake_oracle():
    # Monotone: sustainable up to 7.3 RPS; KV grows 2 GB per RPS.
    calls: list[float] = []

    def oracle(rate: float) -> _Point:
        calls.append(rate)
        a = 1.0 if rate <= 7.3 else 0.5
        return _Point(a, 1.0, round(2 * GB * rate))

    d = classify(DeploymentProfile("fake", 80 * GB), oracle=oracle)
    # Default range [0.5, 64.5]: probes on the 0.5 grid, the answer is the
    # largest multiple of 0.5 <= 7.3.
    assert d.sustainable_rate_rps == 7.0
    assert d.probes_rps[:3] == (0.5, 64.5, 32.5)
    assert d.free_bytes == 80 * GB - 16 * GB - 14 * GB
    assert d.role is Role.PRODUCER and d.r_bytes == d.free_bytes
    assert len(set(calls)) == len(calls)  # each rate evaluated once
    rate, _, _ = oracle_rate(oracle, RoleConfig(rate_low_rps=1.0, rate_high_rps=9.0))
    assert rate == 7.0


def test_fake_oracle_never_sustainable_is_starved():
    d = classify(
        DeploymentProfile("fake", 80 * GB, swap_demand_bytes=5 * GB),
        oracle=lambda rate: _Point(0.0, 0.0, 0),
    )
    assert d.sustainable_rate_rps == 0.0
    assert d.role is Role.CONSUMER and d.r_bytes == -5 * GB


def test_attainment_threshold_is_checked():
    with pytest.raises(ValueError, match="attainment"):
        classify(DeploymentProfile("x", 80 * GB), oracle=lambda r: _Point(1, 1, 0), attainment=0)


def test_replay_oracle_memory_rich_is_producer():
    # An 8B model on a 141 GB H200 at SLOs 1 s / 100 ms.
    d = classify_by_replay(
        DeploymentProfile("small", 141 * GB), "llama-3-8b@h200-sxm-141gb", duration_s=10
    )
    assert d.role is Role.PRODUCER
    assert d.sustainable_rate_rps > 4
    assert d.free_bytes > 50 * GB


def test_replay_oracle_starved_is_consumer():
    # A 32B model (65.5 GB of weights) on an 80 GB H100: little room for KV.
    d = classify_by_replay(
        DeploymentProfile("big", 80 * GB, swap_demand_bytes=20 * GB),
        "qwen2.5-32b@h100-sxm-80gb",
        duration_s=10,
    )
    assert d.role is Role.CONSUMER and d.r_bytes == -20 * GB
    assert d.free_bytes < 10 * GB
