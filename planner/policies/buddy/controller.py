"""KunServe's controller pieces (§4.2-4.3, DESIGN.md §3.3): the drop trigger,
restore with hysteresis, the KV-exchange chunk size and the dispatcher's
rebalance. Pure: the caller passes now_s; the monitors' whole state is
explicit (to_dict / from_dict) so a service can keep it in its store.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_HORIZON_S = 1.0


def time_to_exhaustion_s(
    kv_used_bytes: float,
    kv_rate_bytes_per_s: float,
    hbm_available_bytes: float,
    hbm_rate_bytes_per_s: float,
) -> float:
    """Seconds until KV use meets the HBM available to it, both moving
    linearly at their rates: 0 when already there, inf when the gap does not
    close."""
    gap = hbm_available_bytes - kv_used_bytes
    if gap <= 0:
        return 0.0
    closing = kv_rate_bytes_per_s - hbm_rate_bytes_per_s
    if closing <= 0:
        return math.inf
    return gap / closing


@dataclass(frozen=True, slots=True)
class TriggerConfig:
    """horizon_s: drop when exhaustion is predicted within it (the paper's
    one second). ewma_weight: weight of the newest rate estimate (1: the rate
    between the last two observations)."""

    horizon_s: float = DEFAULT_HORIZON_S
    ewma_weight: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.horizon_s) and self.horizon_s >= 0):
            raise ValueError(f"horizon_s must be finite and >= 0, got {self.horizon_s}")
        if not 0 < self.ewma_weight <= 1:
            raise ValueError(f"ewma_weight must be in (0, 1], got {self.ewma_weight}")


@dataclass(frozen=True, slots=True)
class TriggerDecision:
    """drop: exhaustion predicted within the horizon (or already there).
    shortfall_bytes: KV use beyond the available HBM predicted at the horizon
    (what a drop should free)."""

    instance_id: str
    drop: bool
    time_to_exhaustion_s: float
    kv_rate_bytes_per_s: float
    hbm_rate_bytes_per_s: float
    shortfall_bytes: int


@dataclass(slots=True)
class InstanceMonitor:
    """The drop trigger of one instance. Rates come from the caller when it
    measures them, else from successive observations."""

    instance_id: str
    last_now_s: float | None = None
    last_kv_used_bytes: float = 0.0
    last_hbm_available_bytes: float = 0.0
    kv_rate_bytes_per_s: float = 0.0
    hbm_rate_bytes_per_s: float = 0.0

    def observe(
        self,
        now_s: float,
        kv_used_bytes: float,
        hbm_available_bytes: float,
        config: TriggerConfig,
        *,
        kv_rate_bytes_per_s: float | None = None,
        hbm_rate_bytes_per_s: float | None = None,
    ) -> TriggerDecision:
        if self.last_now_s is not None and now_s < self.last_now_s:
            raise ValueError(
                f"now_s {now_s} is before the last observation of {self.instance_id!r} "
                f"({self.last_now_s})"
            )
        w = config.ewma_weight
        dt = None if self.last_now_s is None else now_s - self.last_now_s
        if kv_rate_bytes_per_s is not None:
            self.kv_rate_bytes_per_s = kv_rate_bytes_per_s
        elif dt:
            rate = (kv_used_bytes - self.last_kv_used_bytes) / dt
            self.kv_rate_bytes_per_s = (1 - w) * self.kv_rate_bytes_per_s + w * rate
        if hbm_rate_bytes_per_s is not None:
            self.hbm_rate_bytes_per_s = hbm_rate_bytes_per_s
        elif dt:
            rate = (hbm_available_bytes - self.last_hbm_available_bytes) / dt
            self.hbm_rate_bytes_per_s = (1 - w) * self.hbm_rate_bytes_per_s + w * rate
        self.last_now_s = now_s
        self.last_kv_used_bytes = kv_used_bytes
        self.last_hbm_available_bytes = hbm_available_bytes
        tte = time_to_exhaustion_s(
            kv_used_bytes,
            self.kv_rate_bytes_per_s,
            hbm_available_bytes,
            self.hbm_rate_bytes_per_s,
        )
        h = config.horizon_s
        shortfall = (kv_used_bytes + self.kv_rate_bytes_per_s * h) - (
            hbm_available_bytes + self.hbm_rate_bytes_per_s * h
        )
        return TriggerDecision(
            instance_id=self.instance_id,
            drop=tte <= h,
            time_to_exhaustion_s=tte,
            kv_rate_bytes_per_s=self.kv_rate_bytes_per_s,
            hbm_rate_bytes_per_s=self.hbm_rate_bytes_per_s,
            shortfall_bytes=max(math.ceil(shortfall), 0),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "last_now_s": self.last_now_s,
            "last_kv_used_bytes": self.last_kv_used_bytes,
            "last_hbm_available_bytes": self.last_hbm_available_bytes,
            "kv_rate_bytes_per_s": self.kv_rate_bytes_per_s,
            "hbm_rate_bytes_per_s": self.hbm_rate_bytes_per_s,
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> InstanceMonitor:
        last = d.get("last_now_s")
        return InstanceMonitor(
            instance_id=str(d["instance_id"]),
            last_now_s=None if last is None else float(last),
            last_kv_used_bytes=float(d.get("last_kv_used_bytes", 0.0)),
            last_hbm_available_bytes=float(d.get("last_hbm_available_bytes", 0.0)),
            kv_rate_bytes_per_s=float(d.get("kv_rate_bytes_per_s", 0.0)),
            hbm_rate_bytes_per_s=float(d.get("hbm_rate_bytes_per_s", 0.0)),
        )


@dataclass(frozen=True, slots=True)
class RestoreConfig:
    """Restore a group only when its KV demand would fit in at most
    low_watermark of the KV region its members have with full replicas, has
    done so for hold_s, and is not predicted to outgrow that region within
    horizon_s. The drop fires at 100% predicted use; the gap to the low
    watermark and the hold time are the hysteresis."""

    low_watermark: float = 0.7
    hold_s: float = 5.0
    horizon_s: float = DEFAULT_HORIZON_S

    def __post_init__(self) -> None:
        if not 0 < self.low_watermark <= 1:
            raise ValueError(f"low_watermark must be in (0, 1], got {self.low_watermark}")
        for name in ("hold_s", "horizon_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {v}")


@dataclass(frozen=True, slots=True)
class RestoreDecision:
    restore: bool
    calm: bool
    calm_for_s: float
    reason: str


@dataclass(slots=True)
class RestoreMonitor:
    """Hysteresis of one group: when its pressure last went calm."""

    calm_since_s: float | None = None

    def observe(
        self,
        now_s: float,
        kv_demand_bytes: float,
        restored_capacity_bytes: float,
        config: RestoreConfig,
        kv_rate_bytes_per_s: float = 0.0,
    ) -> RestoreDecision:
        limit = config.low_watermark * restored_capacity_bytes
        ahead = kv_demand_bytes + max(kv_rate_bytes_per_s, 0.0) * config.horizon_s
        if kv_demand_bytes > limit:
            self.calm_since_s = None
            return RestoreDecision(False, False, 0.0, "above the low watermark")
        if ahead > restored_capacity_bytes:
            self.calm_since_s = None
            return RestoreDecision(False, False, 0.0, "predicted to outgrow the restored region")
        if self.calm_since_s is None or now_s < self.calm_since_s:
            self.calm_since_s = now_s
        calm_for = now_s - self.calm_since_s
        if calm_for >= config.hold_s:
            return RestoreDecision(True, True, calm_for, "calm for the hold time")
        return RestoreDecision(False, True, calm_for, "calm, holding")

    def to_dict(self) -> dict[str, Any]:
        return {"calm_since_s": self.calm_since_s}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> RestoreMonitor:
        v = d.get("calm_since_s")
        return RestoreMonitor(None if v is None else float(v))


def activation_gap_s(stage_compute_s: float, activation_bytes: float, link_gbps: float) -> float:
    """Time between two activation transfers on a link: a stage computes
    for stage_compute_s, then its activation occupies the link."""
    return max(stage_compute_s - activation_bytes / (link_gbps * 1e9), 0.0)


def exchange_chunk_bytes(link_gbps: float, gap_s: float, align_bytes: int = 1) -> int:
    """The largest KV-exchange chunk that fits between two activation
    transfers (bandwidth x profiled gap), rounded down to align_bytes (e.g.
    one token's or one block's KV in a layer), at least one unit: activations
    then never wait behind more than one chunk."""
    if link_gbps <= 0 or gap_s < 0 or align_bytes < 1:
        raise ValueError("link_gbps > 0, gap_s >= 0 and align_bytes >= 1 are required")
    fit = int(link_gbps * 1e9 * gap_s)
    return max(fit // align_bytes, 1) * align_bytes


def exchange_time_s(kv_bytes: float, link_gbps: float) -> float:
    """A blocking exchange of kv_bytes over the link."""
    return kv_bytes / (link_gbps * 1e9)


@dataclass(frozen=True, slots=True)
class Move:
    source: str
    target: str
    requests: int


@dataclass(frozen=True, slots=True)
class Rebalance:
    """moves: overflowed requests sent from one instance to another.
    unplaced: overflow no instance has room for (stays queued)."""

    moves: tuple[Move, ...]
    loads: dict[str, int]
    unplaced: int


def rebalance(loads: Mapping[str, int], max_batch: Mapping[str, int]) -> Rebalance:
    """The dispatcher's re-balance after a drop (KunServe §4.3): each
    instance serves at most its profiled max batch; the overflow goes to the
    instances with the most spare batch slots, largest overflow first (ties by
    id)."""
    for name, table in (("loads", loads), ("max_batch", max_batch)):
        for k, v in table.items():
            if v < 0:
                raise ValueError(f"{name}[{k!r}] must be >= 0, got {v}")
    missing = set(loads) - set(max_batch)
    if missing:
        raise ValueError(f"no max batch for {sorted(missing)}")
    out = dict(loads)
    spare = [(-(max_batch[k] - v), k) for k, v in sorted(loads.items()) if max_batch[k] > v]
    heapq.heapify(spare)
    sources = sorted(
        ((v - max_batch[k], k) for k, v in loads.items() if v > max_batch[k]),
        key=lambda x: (-x[0], x[1]),
    )
    moves = []
    unplaced = 0
    for overflow, src in sources:
        over = overflow
        while over > 0 and spare:
            neg, dst = heapq.heappop(spare)
            n = min(over, -neg)
            moves.append(Move(src, dst, n))
            out[src] -= n
            out[dst] += n
            over -= n
            if -neg > n:
                heapq.heappush(spare, (neg + n, dst))
        unplaced += over
    return Rebalance(tuple(moves), out, unplaced)
