"""The CPU-GPU link: bandwidth as a function of transfer size and direction,
and what happens when both directions are busy at once.

Per direction, a link has a *curve*: the bandwidth one copy of ``size``
bytes achieves when that direction runs alone.

- :class:`SaturatingCurve` ``gbps(size) = peak * size / (size + half_size)``.
  It is the same as a fixed cost per copy: moving ``size`` bytes takes
  ``(size + half_size) / peak``, i.e. a latency of ``half_size / peak`` plus
  the bytes at the peak rate. ``half_size`` is where the curve reaches half
  the peak.
- :class:`MeasuredCurve`: measured (size, GB/s) points; log-size linear
  interpolation between them, constant above the largest, and below the
  smallest the smallest point's *time* (latency-bound: a smaller copy takes as
  long, so its bandwidth falls in proportion to its size).

Both directions at once (:meth:`LinkModel.concurrent_gbps`):

- ``full_duplex=False``: the directions take turns (each copy runs alone).
- ``full_duplex=True``: both run at once, each at its own curve, except that
  (a) measured ``duplex_points`` cap each direction at what was measured with
  both busy (interpolated like a curve, flat beyond the measured sizes), and
  (b) ``shared_cap_gbps`` caps their *sum*: on GH200 the Grace LPDDR5X behind
  NVLink-C2C is half duplex, 384 GB/s for reads and writes together
  (SuperInfer §3.3), so concurrent H2D + D2H share it, max-min fair (a
  direction that wants less than half leaves the rest to the other).

The built-in GH200 curve is fitted to the SuperInfer paper's numbers (§3.3,
§4.3.1, Table 1): single-direction peaks 270 GB/s H2D and 239 GB/s D2H (Table
1, MS+MK: one batched launch of 8 GiB per direction, so effectively the
large-size limit), and one ``half_size`` of 1.75 MiB (1,835,008 bytes) for
both directions, the value that satisfies both of the paper's anchors:

- ≤ 64 KB copies fall under 10 GB/s (§4.3.1): 9.3 GB/s H2D, 8.2 GB/s D2H at
  64 KiB (needs half_size ≥ 1.66 MiB for H2D);
- ≥ 8 MB copies reach ~200 GB/s per direction with both busy (Fig. 5): at
  8 MiB alone 221.5 H2D / 196.1 D2H, together capped by the DRAM at 192 + 192
  (needs the D2H curve ≥ 192 at 8 MiB: half_size ≤ 1.96 MiB).

The implied per-copy latency is 1.75 MiB / 270 GB/s ≈ 6.8 µs (H2D), 7.7 µs
(D2H), in line with the paper's remark that cudaMemcpyAsync's launch costs
more than the copy itself up to a few MB.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Literal

from planner.profiles.errors import ProfileError

GB = 1e9
KIB = 1024
MIB = 1024**2
GIB = 1024**3

Direction = Literal["h2d", "d2h"]
DIRECTIONS: tuple[Direction, Direction] = ("h2d", "d2h")

# "A large transfer" when a single number is wanted (HardwareProfile.h2d_gbps
# and friends): the curves' asymptotes.
LARGE_TRANSFER_BYTES = math.inf


@dataclass(frozen=True, slots=True)
class SaturatingCurve:
    """``gbps(size) = peak_gbps * size / (size + half_size_bytes)``; a
    ``half_size_bytes`` of 0 is a flat line at the peak."""

    peak_gbps: float
    half_size_bytes: float = 0.0

    def __post_init__(self) -> None:
        if not self.peak_gbps > 0 or not math.isfinite(self.peak_gbps):
            raise ProfileError("peak_gbps", f"must be a positive number, got {self.peak_gbps!r}")
        if not self.half_size_bytes >= 0 or not math.isfinite(self.half_size_bytes):
            raise ProfileError("half_size_bytes", f"must be >= 0, got {self.half_size_bytes!r}")

    def gbps(self, size_bytes: float) -> float:
        if size_bytes <= 0:
            return 0.0
        if math.isinf(size_bytes):
            return self.peak_gbps
        return self.peak_gbps * size_bytes / (size_bytes + self.half_size_bytes)

    def latency_s(self) -> float:
        """The fixed cost per copy this curve implies."""
        return self.half_size_bytes / (self.peak_gbps * GB)


@dataclass(frozen=True, slots=True)
class MeasuredPoint:
    size_bytes: int
    gbps: float


@dataclass(frozen=True, slots=True)
class MeasuredCurve:
    """Measured points, sizes strictly increasing."""

    points: tuple[MeasuredPoint, ...]

    def __post_init__(self) -> None:
        if not self.points:
            raise ProfileError("points", "needs at least one point")
        for i, p in enumerate(self.points):
            if p.size_bytes <= 0:
                raise ProfileError(f"points[{i}].size_bytes", "must be > 0")
            if not p.gbps > 0 or not math.isfinite(p.gbps):
                raise ProfileError(f"points[{i}].gbps", "must be a positive number")
            if i and p.size_bytes <= self.points[i - 1].size_bytes:
                raise ProfileError(f"points[{i}].size_bytes", "sizes must be strictly increasing")

    def gbps(self, size_bytes: float) -> float:
        if size_bytes <= 0:
            return 0.0
        pts = self.points
        first, last = pts[0], pts[-1]
        if size_bytes <= first.size_bytes:
            return first.gbps * size_bytes / first.size_bytes
        if size_bytes >= last.size_bytes:
            return last.gbps
        i = bisect.bisect_left([p.size_bytes for p in pts], size_bytes)
        lo, hi = pts[i - 1], pts[i]
        f = math.log(size_bytes / lo.size_bytes) / math.log(hi.size_bytes / lo.size_bytes)
        return lo.gbps + f * (hi.gbps - lo.gbps)


Curve = SaturatingCurve | MeasuredCurve


@dataclass(frozen=True, slots=True)
class DuplexPoint:
    """Per-direction bandwidth measured with both directions busy, each
    copying segments of ``size_bytes``."""

    size_bytes: int
    h2d_gbps: float
    d2h_gbps: float


@dataclass(frozen=True, slots=True)
class LinkModel:
    """A CPU-GPU link. See the module docstring for the model."""

    name: str
    h2d: Curve
    d2h: Curve
    full_duplex: bool = True
    shared_cap_gbps: float | None = None
    link_peak_gbps: float | None = None
    duplex_points: tuple[DuplexPoint, ...] = ()
    _duplex_curves: tuple[MeasuredCurve, MeasuredCurve] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if self.shared_cap_gbps is not None and not self.shared_cap_gbps > 0:
            raise ProfileError("shared_cap_gbps", "must be > 0 (or absent)")
        if self.link_peak_gbps is not None and not self.link_peak_gbps > 0:
            raise ProfileError("link_peak_gbps", "must be > 0 (or absent)")
        sizes = [p.size_bytes for p in self.duplex_points]
        for i, p in enumerate(self.duplex_points):
            if p.size_bytes <= 0:
                raise ProfileError(f"duplex_points[{i}].size_bytes", "must be > 0")
            if not (p.h2d_gbps > 0 and p.d2h_gbps > 0):
                raise ProfileError(f"duplex_points[{i}]", "rates must be > 0")
            if i and sizes[i] <= sizes[i - 1]:
                raise ProfileError(
                    f"duplex_points[{i}].size_bytes", "sizes must be strictly increasing"
                )
        if self.duplex_points:
            pts = self.duplex_points
            curves = (
                MeasuredCurve(tuple(MeasuredPoint(p.size_bytes, p.h2d_gbps) for p in pts)),
                MeasuredCurve(tuple(MeasuredPoint(p.size_bytes, p.d2h_gbps) for p in pts)),
            )
            object.__setattr__(self, "_duplex_curves", curves)

    @staticmethod
    def flat(h2d_gbps: float, d2h_gbps: float, full_duplex: bool, name: str = "link") -> LinkModel:
        """A size-independent link (what a profile with only h2d_gbps,
        d2h_gbps and full_duplex describes)."""
        return LinkModel(name, SaturatingCurve(h2d_gbps), SaturatingCurve(d2h_gbps), full_duplex)

    def curve(self, direction: Direction) -> Curve:
        return self.h2d if direction == "h2d" else self.d2h

    def gbps(self, size_bytes: float, direction: Direction) -> float:
        """GB/s of one copy of ``size_bytes`` with the other direction idle."""
        rate = self.curve(direction).gbps(size_bytes)
        if self.link_peak_gbps is not None:
            rate = min(rate, self.link_peak_gbps)
        return rate

    def concurrent_gbps(self, h2d_size_bytes: float, d2h_size_bytes: float) -> tuple[float, float]:
        """(H2D, D2H) GB/s while both directions copy at once, in segments of
        the given sizes. Half duplex: each its alone rate, for the time it
        has the link (they take turns; see :meth:`transfer_time_s`)."""
        h = self.gbps(h2d_size_bytes, "h2d")
        d = self.gbps(d2h_size_bytes, "d2h")
        if not self.full_duplex:
            return h, d
        if self._duplex_curves is not None:
            dh, dd = self._duplex_curves
            h = min(h, _cap_at(dh, h2d_size_bytes))
            d = min(d, _cap_at(dd, d2h_size_bytes))
        cap = self.shared_cap_gbps
        if cap is None or h + d <= cap:
            return h, d
        share = cap / 2
        if h < share:
            return h, cap - h
        if d < share:
            return cap - d, d
        return share, share

    def large_transfer_gbps(self, both: bool = True) -> tuple[float, float]:
        """(H2D, D2H) GB/s for large copies, with both directions busy (the
        rotation case) or each alone."""
        size = LARGE_TRANSFER_BYTES
        if both and self.full_duplex:
            return self.concurrent_gbps(size, size)
        return self.gbps(size, "h2d"), self.gbps(size, "d2h")

    def one_way_time_s(
        self, nbytes: float, direction: Direction, segment_bytes: float | None = None
    ) -> float:
        """Seconds to move ``nbytes`` in one direction, the other idle, as
        copies of ``segment_bytes`` each (default: one copy of everything).
        A batched launch (cudaMemcpyBatchAsync) that merges many segments
        counts as one copy of their total."""
        if nbytes <= 0:
            return 0.0
        seg = _segment(nbytes, segment_bytes)
        return nbytes / (self.gbps(seg, direction) * GB)

    def transfer_time_s(
        self, d2h_bytes: float, h2d_bytes: float, segment_bytes: float | None = None
    ) -> float:
        """Seconds to move ``d2h_bytes`` GPU→CPU and ``h2d_bytes`` CPU→GPU
        issued together, in copies of ``segment_bytes`` (default: one copy per
        direction).

        Full duplex: both run at their concurrent rates until the shorter one
        ends, then the rest of the other at its alone rate. Half duplex: one
        after the other.
        """
        if d2h_bytes <= 0:
            return self.one_way_time_s(h2d_bytes, "h2d", segment_bytes)
        if h2d_bytes <= 0:
            return self.one_way_time_s(d2h_bytes, "d2h", segment_bytes)
        seg_h = _segment(h2d_bytes, segment_bytes)
        seg_d = _segment(d2h_bytes, segment_bytes)
        if not self.full_duplex:
            return self.one_way_time_s(h2d_bytes, "h2d", seg_h) + self.one_way_time_s(
                d2h_bytes, "d2h", seg_d
            )
        rate_h, rate_d = self.concurrent_gbps(seg_h, seg_d)
        t_h = h2d_bytes / (rate_h * GB)
        t_d = d2h_bytes / (rate_d * GB)
        if t_h <= t_d:
            rest = d2h_bytes - t_h * rate_d * GB
            return t_h + rest / (self.gbps(seg_d, "d2h") * GB)
        rest = h2d_bytes - t_d * rate_h * GB
        return t_d + rest / (self.gbps(seg_h, "h2d") * GB)


def _cap_at(curve: MeasuredCurve, size_bytes: float) -> float:
    """A both-busy cap at ``size_bytes``: interpolated between the measured
    points, flat beyond them on both sides (below the smallest measured size
    the alone curve is what binds, not the shared resource)."""
    first = curve.points[0]
    if size_bytes <= first.size_bytes:
        return first.gbps
    return curve.gbps(size_bytes)


def _segment(nbytes: float, segment_bytes: float | None) -> float:
    if segment_bytes is None:
        return nbytes
    if not segment_bytes > 0:
        raise ProfileError("segment_bytes", f"must be > 0, got {segment_bytes!r}")
    return min(segment_bytes, nbytes)


# --- Built-in links ----------------------------------------------------------------

# GH200 NVLink-C2C, fitted to SuperInfer (see the module docstring): alone
# 270 GB/s H2D, 239 GB/s D2H (Table 1, MS+MK, 269.69 / 238.95), half size
# 1.75 MiB; both busy: Grace DRAM half duplex, 384 GB/s in total per NUMA
# node (§3.3; NVIDIA Grace datasheet); C2C itself 450 GB/s per direction
# (900 GB/s bidirectional, NVIDIA GH200 datasheet), never the bound here.
GH200_C2C = LinkModel(
    name="NVLink-C2C",
    h2d=SaturatingCurve(270.0, 1.75 * MIB),
    d2h=SaturatingCurve(239.0, 1.75 * MIB),
    full_duplex=True,
    shared_cap_gbps=384.0,
    link_peak_gbps=450.0,
)

# PCIe Gen5 x16: 64 GB/s per direction raw (32 GT/s x 16 lanes, 128b/130b);
# pinned-memory cudaMemcpy sustains ~55 GB/s per direction, both directions
# at once (x86 host DRAM is not the bound). Small copies: an estimated ~5 µs
# fixed cost per copy (half size 256 KiB at 55 GB/s = 4.8 µs), to be replaced
# by a measured profile.
PCIE_GEN5_X16 = LinkModel(
    name="PCIe Gen5 x16",
    h2d=SaturatingCurve(55.0, 256 * KIB),
    d2h=SaturatingCurve(55.0, 256 * KIB),
    full_duplex=True,
    link_peak_gbps=64.0,
)

# PCIe Gen4 x16: 32 GB/s raw per direction, ~25 GB/s sustained pinned;
# half size 128 KiB (~5.2 µs per copy), an estimate as above.
PCIE_GEN4_X16 = LinkModel(
    name="PCIe Gen4 x16",
    h2d=SaturatingCurve(25.0, 128 * KIB),
    d2h=SaturatingCurve(25.0, 128 * KIB),
    full_duplex=True,
    link_peak_gbps=32.0,
)
