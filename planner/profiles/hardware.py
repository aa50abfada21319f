"""Hardware profiles: one GPU, its host memory and the link between them.

The first five fields are what the rotation policy and the proto carry:
``hbm_bytes`` and the sustained large-transfer rates per direction
(``h2d_gbps``, ``d2h_gbps``) with ``full_duplex`` — for built-ins these are
the rates with *both* directions busy, since rotation moves one block out for
one in (GH200: 192 + 192 GB/s, the Grace DRAM's 384 GB/s shared). The rest
(defaults 0 = unknown) feed the cost model and the link model:

- ``peak_bf16_tflops``: dense bf16 tensor-core peak (no sparsity);
- ``hbm_gbps``: HBM bandwidth;
- ``host_memory_bytes``: CPU memory the GPU can swap into (GH200: its own
  Grace LPDDR5X; PCIe machines: the DGX system memory divided by its 8 GPUs);
- ``nvlink_gbps``: GPU-GPU NVLink per GPU (tensor-parallel all-reduce);
- ``link``: the CPU-GPU link's size/direction curve (:mod:`.link`);
- achievable fractions of the peaks, the same for every built-in and stated
  once here: ``gemm_efficiency`` 0.65 (large bf16 GEMMs on H100/A100 sustain
  ~65-75% of the datasheet peak; end-to-end prefill MFU in vLLM-class engines
  is ~50-65%; 0.65 sits between), ``hbm_efficiency`` 0.8 (memory-bound decode
  GEMV and attention kernels stream weights/KV at ~80% of the datasheet
  bandwidth), ``attention_efficiency`` 0.5 (FlashAttention-2/3 forward
  reaches ~50-70% of the tensor peak at head dim 128; 0.5 is conservative).

Spec sources: NVIDIA H100 datasheet (SXM5: 80 GB HBM3, 3.35 TB/s, 989 TFLOP/s
bf16 dense, NVLink 900 GB/s, PCIe Gen5); NVIDIA H200 datasheet (SXM: 141 GB
HBM3e, 4.8 TB/s, same compute as H100 SXM); NVIDIA A100 datasheet (SXM4 80 GB:
HBM2e 2,039 GB/s, 312 TFLOP/s bf16, NVLink 600 GB/s, PCIe Gen4); NVIDIA GH200
Grace Hopper Superchip datasheet (96 GB HBM3 at 4 TB/s or 144 GB HBM3e at
4.9 TB/s, 480 GB LPDDR5X, NVLink-C2C 900 GB/s bidirectional, H100-class
compute); DGX H100 / DGX H200 / DGX A100 datasheets (2 TB system memory for 8
GPUs); the SuperInfer paper (§3.3, §5, Table 1) for GH200 link behaviour.
Capacities are the datasheets' decimal GB (conservative: an "80 GB" H100 has
~85e9 bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.profiles.link import (
    GH200_C2C,
    PCIE_GEN4_X16,
    PCIE_GEN5_X16,
    LinkModel,
)

GB = 1e9

GEMM_EFFICIENCY = 0.65
HBM_EFFICIENCY = 0.8
ATTENTION_EFFICIENCY = 0.5


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    name: str
    hbm_bytes: int
    h2d_gbps: float
    d2h_gbps: float
    full_duplex: bool
    host_memory_bytes: int = 0
    peak_bf16_tflops: float = 0.0
    hbm_gbps: float = 0.0
    nvlink_gbps: float = 0.0
    link: LinkModel | None = None
    gemm_efficiency: float = GEMM_EFFICIENCY
    hbm_efficiency: float = HBM_EFFICIENCY
    attention_efficiency: float = ATTENTION_EFFICIENCY
    source: str = ""

    def swap_bytes_per_s(self) -> float:
        """Bytes per second at which blocks can be rotated, one out for one in.

        Full duplex: the slower direction bounds it. Otherwise each block in
        and each block out take turns on the link.
        """
        h2d = self.h2d_gbps * GB
        d2h = self.d2h_gbps * GB
        if self.full_duplex:
            return min(h2d, d2h)
        return 1.0 / (1.0 / h2d + 1.0 / d2h)

    def link_model(self) -> LinkModel:
        """The size/direction link model; a flat one from h2d_gbps, d2h_gbps
        and full_duplex when the profile gives none."""
        if self.link is not None:
            return self.link
        return LinkModel.flat(self.h2d_gbps, self.d2h_gbps, self.full_duplex)

    @property
    def has_compute_facts(self) -> bool:
        return self.peak_bf16_tflops > 0 and self.hbm_gbps > 0

    @staticmethod
    def from_link(
        name: str,
        *,
        hbm_bytes: int,
        link: LinkModel,
        host_memory_bytes: int,
        peak_bf16_tflops: float,
        hbm_gbps: float,
        nvlink_gbps: float = 0.0,
        gemm_efficiency: float = GEMM_EFFICIENCY,
        hbm_efficiency: float = HBM_EFFICIENCY,
        attention_efficiency: float = ATTENTION_EFFICIENCY,
        source: str = "",
    ) -> HardwareProfile:
        """A profile whose h2d_gbps / d2h_gbps are the link's large-transfer
        rates with both directions busy (alone, when it is half duplex)."""
        h2d, d2h = link.large_transfer_gbps(both=True)
        return HardwareProfile(
            name=name,
            hbm_bytes=hbm_bytes,
            h2d_gbps=h2d,
            d2h_gbps=d2h,
            full_duplex=link.full_duplex,
            host_memory_bytes=host_memory_bytes,
            peak_bf16_tflops=peak_bf16_tflops,
            hbm_gbps=hbm_gbps,
            nvlink_gbps=nvlink_gbps,
            link=link,
            gemm_efficiency=gemm_efficiency,
            hbm_efficiency=hbm_efficiency,
            attention_efficiency=attention_efficiency,
            source=source,
        )


# Hopper dense bf16 peak: 989.4 TFLOP/s (H100 SXM5 datasheet: 1,979 TFLOP/s
# with 2:4 sparsity). GH200 and H200 have the same Hopper GPU.
_HOPPER_BF16_TFLOPS = 989.4
# DGX H100 / H200 / A100: 2 TB of system memory for 8 GPUs.
_DGX_HOST_BYTES_PER_GPU = int(2e12 / 8)

_BUILTIN_HARDWARE = (
    # GH200 144 GB: HBM3e 4.9 TB/s; Grace 480 GB LPDDR5X; NVLink-C2C (the
    # SuperInfer testbed: GH200 NVL2, 144 GB HBM + 480 GB DRAM per superchip,
    # 900 GB/s NVLink between the two Hoppers).
    HardwareProfile.from_link(
        "gh200-144gb",
        hbm_bytes=int(144e9),
        link=GH200_C2C,
        host_memory_bytes=int(480e9),
        peak_bf16_tflops=_HOPPER_BF16_TFLOPS,
        hbm_gbps=4900.0,
        nvlink_gbps=900.0,
        source="NVIDIA GH200 datasheet (144 GB HBM3e); SuperInfer §3.3, §5, Table 1",
    ),
    # GH200 96 GB: HBM3 4.0 TB/s; otherwise the same superchip.
    HardwareProfile.from_link(
        "gh200-96gb",
        hbm_bytes=int(96e9),
        link=GH200_C2C,
        host_memory_bytes=int(480e9),
        peak_bf16_tflops=_HOPPER_BF16_TFLOPS,
        hbm_gbps=4000.0,
        nvlink_gbps=900.0,
        source="NVIDIA GH200 datasheet (96 GB HBM3); SuperInfer §3.3",
    ),
    HardwareProfile.from_link(
        "h100-sxm-80gb",
        hbm_bytes=int(80e9),
        link=PCIE_GEN5_X16,
        host_memory_bytes=_DGX_HOST_BYTES_PER_GPU,
        peak_bf16_tflops=_HOPPER_BF16_TFLOPS,
        hbm_gbps=3350.0,
        nvlink_gbps=900.0,
        source="NVIDIA H100 SXM5 datasheet; DGX H100 (2 TB / 8 GPUs); PCIe Gen5 x16",
    ),
    HardwareProfile.from_link(
        "h200-sxm-141gb",
        hbm_bytes=int(141e9),
        link=PCIE_GEN5_X16,
        host_memory_bytes=_DGX_HOST_BYTES_PER_GPU,
        peak_bf16_tflops=_HOPPER_BF16_TFLOPS,
        hbm_gbps=4800.0,
        nvlink_gbps=900.0,
        source="NVIDIA H200 SXM datasheet; DGX H200 (2 TB / 8 GPUs); PCIe Gen5 x16",
    ),
    HardwareProfile.from_link(
        "a100-sxm-80gb",
        hbm_bytes=int(80e9),
        link=PCIE_GEN4_X16,
        host_memory_bytes=_DGX_HOST_BYTES_PER_GPU,
        peak_bf16_tflops=312.0,
        hbm_gbps=2039.0,
        nvlink_gbps=600.0,
        source="NVIDIA A100 SXM4 80GB datasheet; DGX A100 (2 TB / 8 GPUs); PCIe Gen4 x16",
    ),
)

HARDWARE_PROFILES: dict[str, HardwareProfile] = {p.name: p for p in _BUILTIN_HARDWARE}

# Other spellings the lookup helpers accept.
HARDWARE_ALIASES: dict[str, str] = {
    "gh200": "gh200-144gb",
    "gh200-144": "gh200-144gb",
    "gh200-96": "gh200-96gb",
    "h100": "h100-sxm-80gb",
    "h100-sxm": "h100-sxm-80gb",
    "h200": "h200-sxm-141gb",
    "h200-sxm": "h200-sxm-141gb",
    "a100": "a100-sxm-80gb",
    "a100-sxm": "a100-sxm-80gb",
}


def find_hardware(name: str) -> HardwareProfile | None:
    """A built-in hardware profile by name or alias (case-insensitive), else None."""
    key = name.strip().lower()
    key = HARDWARE_ALIASES.get(key, key)
    return HARDWARE_PROFILES.get(key)
