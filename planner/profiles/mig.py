"""MIG slice profiles of GH200 and its shared NVLink-C2C link (C2CServe).

C2CServe Table 1 gives, for each GH200 (96 GB HBM3, 4.0 TB/s) MIG
configuration, the instances it makes and what one instance gets:

| config      | 1 x 96 GB | 2 x 48 GB | 3 x 24 GB | 4 x 24 GB | 7 x 12 GB |
|-------------|-----------|-----------|-----------|-----------|-----------|
| SMs         | 132       | 56        | 28        | 16        | 16        |
| HBM BW      | 4.0 TB/s  | 2.0 TB/s  | 1.0 TB/s  | 1.0 TB/s  | 0.5 TB/s  |

The numbers are the paper's as printed (they are not NVIDIA's MIG profile
names: GH200's 3g.48gb has 60 SMs, and 3 x 24 GB with 28 SMs each is what the
paper measured, not a sum of the full GPU). HBM capacity is the
configuration's label. All slices of one GPU share one C2C link: 450 GB/s
per direction peak (900 GB/s bidirectional, NVIDIA GH200 datasheet); weights
stream host-to-device only, so the host-to-device direction is the budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.profiles.errors import ProfileError

GB = 1e9

# Hopper dense bf16 peak of the full 132-SM GPU (H100 SXM5 datasheet); a slice
# gets its SM share.
FULL_GPU_SMS = 132
FULL_GPU_BF16_TFLOPS = 989.4


@dataclass(frozen=True, slots=True)
class MigSliceProfile:
    """One MIG instance: its compute, HBM capacity and HBM bandwidth."""

    name: str
    sms: int
    hbm_bytes: int
    hbm_gbps: float
    # Instances of this size the configuration makes on one GPU.
    instances: int = 1
    # Achievable fractions of the peaks (hardware.py's constants).
    gemm_efficiency: float = 0.65
    hbm_efficiency: float = 0.8

    @property
    def peak_bf16_tflops(self) -> float:
        return FULL_GPU_BF16_TFLOPS * self.sms / FULL_GPU_SMS

    @property
    def compute_flops_per_s(self) -> float:
        """Sustained dense bf16 FLOP/s."""
        return self.peak_bf16_tflops * 1e12 * self.gemm_efficiency

    @property
    def hbm_bytes_per_s(self) -> float:
        """Sustained HBM bytes per second."""
        return self.hbm_gbps * GB * self.hbm_efficiency

    def check(self) -> None:
        if self.sms <= 0:
            raise ProfileError("sms", f"must be > 0, got {self.sms}")
        if self.hbm_bytes <= 0:
            raise ProfileError("hbm_bytes", f"must be > 0, got {self.hbm_bytes}")
        if not self.hbm_gbps > 0:
            raise ProfileError("hbm_gbps", f"must be > 0, got {self.hbm_gbps}")


@dataclass(frozen=True, slots=True)
class C2CLinkProfile:
    """The CPU-GPU link all slices of a GPU share (host-to-device direction)."""

    name: str
    peak_gbps: float
    # Sustained fraction of the peak for zero-copy weight reads.
    efficiency: float = 0.9

    @property
    def sustained_gbps(self) -> float:
        return self.peak_gbps * self.efficiency


GH200_C2C_LINK = C2CLinkProfile("gh200-nvlink-c2c", peak_gbps=450.0)

# C2CServe Table 1, keyed "<instances>x<HBM GB>".
MIG_PROFILES: dict[str, MigSliceProfile] = {
    p.name: p
    for p in (
        MigSliceProfile("gh200-1x96gb", sms=132, hbm_bytes=int(96e9), hbm_gbps=4000.0, instances=1),
        MigSliceProfile("gh200-2x48gb", sms=56, hbm_bytes=int(48e9), hbm_gbps=2000.0, instances=2),
        MigSliceProfile("gh200-3x24gb", sms=28, hbm_bytes=int(24e9), hbm_gbps=1000.0, instances=3),
        MigSliceProfile("gh200-4x24gb", sms=16, hbm_bytes=int(24e9), hbm_gbps=1000.0, instances=4),
        MigSliceProfile("gh200-7x12gb", sms=16, hbm_bytes=int(12e9), hbm_gbps=500.0, instances=7),
    )
}

MIG_ALIASES: dict[str, str] = {
    "1": "gh200-1x96gb",
    "2": "gh200-2x48gb",
    "3": "gh200-3x24gb",
    "4": "gh200-4x24gb",
    "7": "gh200-7x12gb",
}


def find_mig_profile(name: str) -> MigSliceProfile | None:
    """A Table 1 slice by name ("gh200-3x24gb"), short name ("3x24gb") or
    instance count ("3"); None when unknown."""
    key = name.strip().lower()
    if key in MIG_PROFILES:
        return MIG_PROFILES[key]
    if key in MIG_ALIASES:
        return MIG_PROFILES[MIG_ALIASES[key]]
    return MIG_PROFILES.get(f"gh200-{key}")


def mig_layout(name: str) -> list[MigSliceProfile]:
    """Every slice of one Table 1 configuration (e.g. seven 12 GB slices)."""
    p = find_mig_profile(name)
    if p is None:
        raise ProfileError("mig profile", f"unknown {name!r} (known: {', '.join(MIG_PROFILES)})")
    return [p] * p.instances
