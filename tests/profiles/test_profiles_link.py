"""Link model: bandwidth vs copy size and direction; both directions at once."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.profiles import (
    HARDWARE_PROFILES,
    DuplexPoint,
    HardwareProfile,
    LinkModel,
    MeasuredCurve,
    MeasuredPoint,
    ProfileError,
    SaturatingCurve,
)
from planner.profiles.link import GH200_C2C, KIB, MIB, PCIE_GEN5_X16

GIB = 1024**3
GH200 = HARDWARE_PROFILES["gh200-144gb"].link_model()
SIZES = st.floats(min_value=1.0, max_value=64 * 1024**3, allow_nan=False)


def test_gh200_profiles_use_the_c2c_model():
    assert HARDWARE_PROFILES["gh200-144gb"].link is GH200_C2C
    assert HARDWARE_PROFILES["gh200-96gb"].link is GH200_C2C
    assert HARDWARE_PROFILES["h100-sxm-80gb"].link is PCIE_GEN5_X16


# --- SuperInfer anchor points (§3.3, §4.3.1, Table 1) ---------------------------------


@pytest.mark.parametrize("size", [4 * KIB, 32 * KIB, 64 * KIB, 64_000])
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_small_copies_below_10_gbps(size, direction):
    assert GH200.gbps(size, direction) < 10.0


@pytest.mark.parametrize("size", [8_000_000, 8 * MIB, 16 * MIB, 256 * MIB, 1024**3])
def test_large_copies_about_200_per_direction_concurrently(size):
    h, d = GH200.concurrent_gbps(size, size)
    assert 180 <= h <= 220 and 180 <= d <= 220
    assert h + d <= 384.0 + 1e-9
    # Each direction alone goes faster than its concurrent share (§3.3).
    assert GH200.gbps(size, "h2d") > h and GH200.gbps(size, "d2h") > d


def test_alone_large_rates_are_table_1_ms_mk():
    assert GH200.gbps(math.inf, "h2d") == 270.0  # Table 1: 269.69
    assert GH200.gbps(math.inf, "d2h") == 239.0  # Table 1: 238.95


def test_ideal_duplex_time_of_table_1():
    # Table 1 "Ideal (duplex)": 16 GB in all, 8 GB per direction at 192 + 192
    # GB/s: 41.66 ms.
    t = GH200.transfer_time_s(8e9, 8e9)
    assert t == pytest.approx(8e9 / 192e9)
    assert t * 1e3 == pytest.approx(41.66, abs=0.01)


@given(SIZES, SIZES)
def test_both_directions_together_never_exceed_the_dram(h_size, d_size):
    h, d = GH200.concurrent_gbps(h_size, d_size)
    assert h + d <= 384.0 + 1e-9
    assert 0 < h <= GH200.gbps(h_size, "h2d") + 1e-12
    assert 0 < d <= GH200.gbps(d_size, "d2h") + 1e-12


@given(SIZES, SIZES)
def test_curves_are_monotone_in_size(a, b):
    lo, hi = sorted((a, b))
    for direction in ("h2d", "d2h"):
        assert GH200.gbps(lo, direction) <= GH200.gbps(hi, direction) + 1e-12


def test_saturating_curve_is_a_per_copy_latency():
    c = SaturatingCurve(270.0, 1.75 * MIB)
    assert c.gbps(1.75 * MIB) == pytest.approx(135.0)  # half the peak at half_size
    # Moving n bytes takes n / peak + half_size / peak.
    n = 3 * MIB
    assert n / (c.gbps(n) * 1e9) == pytest.approx(n / 270e9 + c.latency_s())
    assert c.latency_s() == pytest.approx(6.796e-6, rel=1e-3)
    assert c.gbps(0) == 0.0


def test_max_min_sharing_of_the_cap():
    link = LinkModel(
        "t", SaturatingCurve(300.0), SaturatingCurve(100.0), full_duplex=True, shared_cap_gbps=384
    )
    # D2H wants 100 < 192: it keeps it, H2D gets the other 284.
    assert link.concurrent_gbps(MIB, MIB) == pytest.approx((284.0, 100.0))
    both_big = LinkModel("t", SaturatingCurve(300.0), SaturatingCurve(250.0), True, 384)
    assert both_big.concurrent_gbps(MIB, MIB) == (192.0, 192.0)
    under = LinkModel("t", SaturatingCurve(100.0), SaturatingCurve(100.0), True, 384)
    assert under.concurrent_gbps(MIB, MIB) == (100.0, 100.0)


def test_transfer_time_one_direction_finishes_first():
    # 1 GB D2H and 8 GB H2D: 192 + 192 until the D2H ends, then H2D alone.
    t = GH200.transfer_time_s(1e9, 8e9)
    first = 1e9 / 192e9
    rest = 8e9 - first * 192e9
    alone = 270.0 * 8e9 / (8e9 + 1.75 * MIB)
    assert t == pytest.approx(first + rest / (alone * 1e9))
    assert t < GH200.one_way_time_s(1e9, "d2h") + GH200.one_way_time_s(8e9, "h2d")


def test_one_way_and_segments():
    one = GH200.one_way_time_s(64 * MIB, "h2d")
    assert one == pytest.approx(64 * MIB / (GH200.gbps(64 * MIB, "h2d") * 1e9))
    # The same bytes as 1024 copies of 64 KiB: latency-bound, far slower.
    small = GH200.one_way_time_s(64 * MIB, "h2d", segment_bytes=64 * KIB)
    assert small > 20 * one
    # A segment bigger than the transfer is one copy of the transfer.
    assert GH200.one_way_time_s(MIB, "d2h", segment_bytes=GIB) == GH200.one_way_time_s(MIB, "d2h")
    assert GH200.transfer_time_s(0, 0) == 0.0
    assert GH200.transfer_time_s(MIB, 0) == GH200.one_way_time_s(MIB, "d2h")
    with pytest.raises(ProfileError) as err:
        GH200.one_way_time_s(MIB, "h2d", segment_bytes=0)
    assert err.value.field == "segment_bytes"


def test_half_duplex_takes_turns():
    legacy = HardwareProfile("half", 0, 20.0, 30.0, False)
    link = legacy.link_model()
    assert not link.full_duplex
    assert link.transfer_time_s(30e9, 20e9) == pytest.approx(2.0)
    assert link.gbps(1, "h2d") == 20.0  # flat: no size dependence


def test_pcie_is_full_duplex_without_a_shared_cap():
    assert PCIE_GEN5_X16.concurrent_gbps(GIB, GIB) == pytest.approx((55.0, 55.0), rel=1e-3)
    assert PCIE_GEN5_X16.transfer_time_s(55e9, 55e9) == pytest.approx(1.0, rel=1e-3)
    assert PCIE_GEN5_X16.gbps(64 * KIB, "h2d") < 15


def test_rotation_rate_is_the_concurrent_large_transfer_rate():
    for hw in HARDWARE_PROFILES.values():
        h, d = hw.link_model().large_transfer_gbps(both=True)
        assert (hw.h2d_gbps, hw.d2h_gbps) == (h, d)
        assert hw.swap_bytes_per_s() == min(h, d) * 1e9
    assert HARDWARE_PROFILES["gh200-144gb"].swap_bytes_per_s() == 192e9
    assert HARDWARE_PROFILES["h100-sxm-80gb"].swap_bytes_per_s() == 55e9
    assert HARDWARE_PROFILES["a100-sxm-80gb"].swap_bytes_per_s() == 25e9


def test_measured_curve_interpolates_in_log_size():
    c = MeasuredCurve((MeasuredPoint(1024, 1.0), MeasuredPoint(1024**2, 100.0)))
    assert c.gbps(1024) == 1.0 and c.gbps(1024**2) == 100.0
    assert c.gbps(32 * 1024) == pytest.approx(50.5)  # halfway in log(size)
    assert c.gbps(512) == pytest.approx(0.5)  # below: latency-bound
    assert c.gbps(1024**3) == 100.0  # above: flat


def test_measured_curve_and_duplex_points_are_checked():
    with pytest.raises(ProfileError):
        MeasuredCurve(())
    with pytest.raises(ProfileError) as err:
        MeasuredCurve((MeasuredPoint(10, 1.0), MeasuredPoint(10, 2.0)))
    assert err.value.field == "points[1].size_bytes"
    with pytest.raises(ProfileError):
        SaturatingCurve(0.0)
    with pytest.raises(ProfileError):
        LinkModel("x", SaturatingCurve(1.0), SaturatingCurve(1.0), True, shared_cap_gbps=0.0)


def test_duplex_points_cap_each_direction():
    link = LinkModel(
        "m",
        SaturatingCurve(270.0, 1.75 * MIB),
        SaturatingCurve(239.0, 1.75 * MIB),
        True,
        384.0,
        duplex_points=(DuplexPoint(8 * GIB, 179.37, 180.99),),
    )
    assert link.concurrent_gbps(8 * GIB, 8 * GIB) == (179.37, 180.99)
    # Below the measured size the alone curve binds (the cap stays flat).
    h, d = link.concurrent_gbps(64 * KIB, 64 * KIB)
    assert h == link.gbps(64 * KIB, "h2d") and d == link.gbps(64 * KIB, "d2h")
