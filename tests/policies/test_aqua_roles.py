"""AQUA-PROFILER roles on hand-made curves."""

from __future__ import annotations

from planner.domain.placement import (
    BatchPoint,
    DeploymentProfile,
    RatePoint,
    Role,
    RoleConfig,
)
from planner.policies.aqua.roles import classify, sustainable_rate

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
