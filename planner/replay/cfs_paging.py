"""Where CFS pages KV to (AQUA §7, §9): host DRAM over the engine's PCIe link
and its CPU pool (`cfs`), or the memory a producer on a peer GPU lends over
NVLink (`cfs-peer`): a pool of the lent size, and a link at the hardware
profile's NVLink bandwidth.

The NVLink link: the profile's `nvlink_gbps` is the bidirectional datasheet
figure (H100 SXM5: 900 GB/s), so each direction gets half of it, both at once
(full duplex). It is the datasheet peak, an upper bound on what a
peer-to-peer copy sustains; the per-copy fixed cost is the DRAM link's, so
that the two targets differ in bandwidth only.

Copy size: the engine moves each KV block as one copy. vLLM's swap copies
each layer's K and V of a block apart (for llama-3-8b's 16-token blocks, 64
copies of 32 KiB), where a PCIe link is latency-bound; AQUA gathers such
buffers into large ones before an NVLink transfer (§8). `dram_copy_bytes`
makes DRAM paging copy in pieces of that size.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from planner.profiles.hardware import HardwareProfile
from planner.profiles.link import GB, LinkModel, SaturatingCurve
from planner.replay.engine import EngineConfig


class Paging(StrEnum):
    """Where a scheduling policy pages KV to (its registration says)."""

    ENGINE = "engine"
    """The engine's CPU pool over its link, one copy per block."""
    DRAM = "dram"
    """The engine's CPU pool over its link, in copies of dram_copy_bytes."""
    PEER = "peer"
    """A pool a peer GPU lends, over NVLink."""


# The memory a producer lends by default: half of an 80 GB H100.
DEFAULT_PEER_KV_GB = 40.0


def peer_link(hardware: HardwareProfile, dram_link: LinkModel) -> LinkModel:
    """NVLink to a peer GPU: half the profile's bidirectional NVLink bandwidth
    per direction, with the DRAM link's per-copy latency."""
    if not hardware.nvlink_gbps > 0:
        raise ValueError(f"{hardware.name} has no NVLink bandwidth in its profile")
    per_direction = hardware.nvlink_gbps / 2
    latency_s = dram_link.h2d.latency_s() if isinstance(dram_link.h2d, SaturatingCurve) else 0.0
    curve = SaturatingCurve(per_direction, latency_s * per_direction * GB)
    return LinkModel(
        name=f"NVLink peer ({hardware.nvlink_gbps:g} GB/s bidirectional)",
        h2d=curve,
        d2h=curve,
        full_duplex=True,
        link_peak_gbps=per_direction,
    )


@dataclass(frozen=True, slots=True)
class PiecewiseCopies:
    """A link whose transfers are made as copies of `copy_bytes` each."""

    link: LinkModel
    copy_bytes: int

    @property
    def name(self) -> str:
        return f"{self.link.name}, {self.copy_bytes:,}-byte copies"

    def transfer_time_s(self, d2h_bytes: int, h2d_bytes: int, segment_bytes: int) -> float:
        return self.link.transfer_time_s(d2h_bytes, h2d_bytes, min(segment_bytes, self.copy_bytes))


def paging_target(
    paging: Paging,
    engine: EngineConfig,
    link: LinkModel,
    hardware: HardwareProfile,
    *,
    peer_kv_bytes: int,
    dram_copy_bytes: int | None = None,
) -> tuple[EngineConfig, LinkModel | PiecewiseCopies]:
    """The engine's pools and link for a policy's paging: PEER pages into a
    peer_kv_bytes pool over NVLink; DRAM into the engine's CPU pool over its
    link, in copies of dram_copy_bytes when given; ENGINE keeps the engine's
    pool and link as they are."""
    if paging is Paging.DRAM and dram_copy_bytes is not None:
        return engine, PiecewiseCopies(link, dram_copy_bytes)
    if paging is not Paging.PEER:
        return engine, link
    blocks = peer_kv_bytes // engine.block_bytes
    return replace(engine, cpu_kv_blocks=int(blocks)), peer_link(hardware, link)
