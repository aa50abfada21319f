"""KunServe's controller pieces (DESIGN.md §3.3): the drop trigger fires
before, not after, predicted exhaustion; restore waits out its hysteresis;
the KV-exchange chunk fits between activation transfers; the dispatcher
rebalance respects each instance's max batch."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from planner.policies.buddy import (
    InstanceMonitor,
    RestoreConfig,
    RestoreMonitor,
    TriggerConfig,
    activation_gap_s,
    exchange_chunk_bytes,
    rebalance,
    time_to_exhaustion_s,
)

GB = 10**9


def test_time_to_exhaustion():
    assert time_to_exhaustion_s(60 * GB, 10 * GB, 80 * GB, 0.0) == 2.0
    # Available HBM shrinking at 10 GB/s as well: twice as fast.
    assert time_to_exhaustion_s(60 * GB, 10 * GB, 80 * GB, -10 * GB) == 1.0
    assert time_to_exhaustion_s(60 * GB, 0.0, 80 * GB, 0.0) == math.inf
    assert time_to_exhaustion_s(90 * GB, 0.0, 80 * GB, 0.0) == 0.0


def test_trigger_estimates_rates_from_observations_and_fires_within_one_second():
    m = InstanceMonitor("a")
    cfg = TriggerConfig()
    first = m.observe(0.0, 50 * GB, 80 * GB, cfg)
    assert not first.drop and first.time_to_exhaustion_s == math.inf
    # +10 GB in 0.5 s: 20 GB/s, 20 GB left -> 1 s: at the horizon, drop.
    d = m.observe(0.5, 60 * GB, 80 * GB, cfg)
    assert d.kv_rate_bytes_per_s == pytest.approx(20 * GB)
    assert d.time_to_exhaustion_s == pytest.approx(1.0)
    assert d.drop
    assert d.shortfall_bytes == 0
    # Growth stops: no drop.
    d = m.observe(1.0, 60 * GB, 80 * GB, cfg)
    assert not d.drop and d.kv_rate_bytes_per_s == 0.0


def test_trigger_counts_the_hbm_change_rate():
    m = InstanceMonitor("a")
    cfg = TriggerConfig(horizon_s=1.0)
    d = m.observe(
        0.0, 60 * GB, 80 * GB, cfg, kv_rate_bytes_per_s=5 * GB, hbm_rate_bytes_per_s=-20 * GB
    )
    # Closing at 25 GB/s with 20 GB left: 0.8 s.
    assert d.time_to_exhaustion_s == pytest.approx(0.8)
    assert d.drop
    assert d.shortfall_bytes == 5 * GB


def test_trigger_state_round_trips_and_refuses_time_going_back():
    m = InstanceMonitor("a")
    m.observe(1.0, 10.0, 100.0, TriggerConfig())
    m.observe(2.0, 30.0, 100.0, TriggerConfig())
    copy = InstanceMonitor.from_dict(m.to_dict())
    assert copy == m
    with pytest.raises(ValueError, match="before the last observation"):
        copy.observe(1.5, 30.0, 100.0, TriggerConfig())


@settings(max_examples=100, deadline=None)
@given(
    kv0=st.floats(0, 50),
    avail=st.floats(60, 100),
    rate=st.floats(0.5, 40),
    hbm_rate=st.floats(-5, 0),
    dt=st.floats(0.01, 1.0),
    horizon=st.floats(0.1, 2.0),
)
def test_trigger_fires_before_not_after_predicted_exhaustion(
    kv0, avail, rate, hbm_rate, dt, horizon
):
    """KV grows and HBM shrinks linearly; observed every dt <= horizon. The
    first drop comes no later than exhaustion and no earlier than a horizon
    before it (once the rates are known)."""
    dt = min(dt, horizon)
    exhaustion = (avail - kv0) / (rate - hbm_rate)
    # The monitor needs two observations to know the rates: the second must
    # come before exhaustion.
    assume(exhaustion >= dt)
    m = InstanceMonitor("a")
    cfg = TriggerConfig(horizon_s=horizon)
    # Start watching a little before the horizon opens (keeps the run short).
    start = t = max(0.0, exhaustion - horizon - 3 * dt)
    fired_at = None
    while t <= exhaustion + 2 * dt:
        d = m.observe(t, kv0 + rate * t, avail + hbm_rate * t, cfg)
        if d.drop:
            fired_at = t
            break
        t += dt
    assert fired_at is not None
    assert fired_at <= exhaustion + 1e-9
    if fired_at > start:  # rates known from the second observation on
        assert fired_at >= exhaustion - horizon - 1e-6


def test_restore_waits_for_the_hold_time_below_the_low_watermark():
    cfg = RestoreConfig(low_watermark=0.7, hold_s=5.0, horizon_s=1.0)
    m = RestoreMonitor()
    cap = 100 * GB
    assert m.observe(0.0, 90 * GB, cap, cfg).reason == "above the low watermark"
    d = m.observe(1.0, 60 * GB, cap, cfg)
    assert d.calm and not d.restore and d.calm_for_s == 0.0
    assert not m.observe(5.9, 60 * GB, cap, cfg).restore
    # Back above the watermark: the hold starts over.
    assert not m.observe(6.0, 75 * GB, cap, cfg).calm
    assert not m.observe(7.0, 50 * GB, cap, cfg).restore
    assert not m.observe(11.5, 50 * GB, cap, cfg).restore
    d = m.observe(12.0, 50 * GB, cap, cfg)
    assert d.restore and d.calm_for_s == pytest.approx(5.0)
    assert RestoreMonitor.from_dict(m.to_dict()) == m


def test_restore_refused_when_growth_would_outgrow_the_restored_region():
    cfg = RestoreConfig(hold_s=0.0)
    d = RestoreMonitor().observe(0.0, 60 * GB, 100 * GB, cfg, kv_rate_bytes_per_s=50 * GB)
    assert not d.restore and "outgrow" in d.reason
    assert RestoreMonitor().observe(0.0, 60 * GB, 100 * GB, cfg).restore


def test_exchange_chunk_fits_between_activation_transfers():
    """Qwen-2.5-14B over 200 Gbps (25 GB/s): per-layer KV of one token is
    4 KiB (192 KiB over 48 layers); a stage of 2 ms whose 672 KB activation
    takes ~27 us leaves a gap of ~1.97 ms."""
    gbps = 200 / 8
    gap = activation_gap_s(0.002, 672 * 1024, gbps)
    assert gap == pytest.approx(0.002 - 672 * 1024 / 25e9)
    chunk = exchange_chunk_bytes(gbps, gap, align_bytes=4096)
    assert chunk % 4096 == 0
    assert chunk / 25e9 <= gap  # never blocks the next activation
    assert (chunk + 4096) / 25e9 > gap  # and is the largest that fits
    # 1 K tokens of KV (192 MiB, the paper's example) take many chunks.
    assert math.ceil(192 * 1024**2 / chunk) == 5
    # A gap too short for one unit still moves one unit at a time.
    assert exchange_chunk_bytes(gbps, 0.0, 4096) == 4096
    with pytest.raises(ValueError):
        exchange_chunk_bytes(0.0, 1.0)


def test_rebalance_moves_overflow_to_spare_instances():
    r = rebalance({"a": 100, "b": 70, "c": 10, "d": 40}, {"a": 64, "b": 64, "c": 64, "d": 64})
    assert r.unplaced == 0
    assert r.loads == {"a": 64, "b": 64, "c": 46, "d": 46}
    assert sum(r.loads.values()) == 220
    assert all(v <= 64 for v in r.loads.values())
    # Largest overflow first, to the most spare instance.
    assert r.moves[0].source == "a" and r.moves[0].target == "c"


def test_rebalance_leaves_what_does_not_fit_queued():
    r = rebalance({"a": 100, "b": 60}, {"a": 64, "b": 64})
    assert r.moves[0].requests == 4
    assert r.unplaced == 32
    assert r.loads == {"a": 96, "b": 64}
    with pytest.raises(ValueError, match="no max batch"):
        rebalance({"a": 1}, {})


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.text("abcdef", min_size=1, max_size=2),
        st.tuples(st.integers(0, 200), st.integers(0, 100)),
        min_size=1,
        max_size=8,
    )
)
def test_rebalance_conserves_requests_and_respects_max_batch(table):
    loads = {k: v[0] for k, v in table.items()}
    caps = {k: v[1] for k, v in table.items()}
    r = rebalance(loads, caps)
    assert sum(r.loads.values()) == sum(loads.values())
    over = sum(max(v - caps[k], 0) for k, v in loads.items())
    spare = sum(max(caps[k] - v, 0) for k, v in loads.items())
    assert r.unplaced == max(over - spare, 0)
    for k, v in r.loads.items():
        # Overflowing instances shed down to their cap (or as far as spare
        # goes); others fill up to it at most.
        if loads[k] <= caps[k]:
            assert v <= caps[k]
        else:
            assert caps[k] <= v <= loads[k]
