"""Model and hardware profiles: built-in ones from public specifications."""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
GIB = 1024**3


@dataclass(frozen=True, slots=True)
class ModelProfile:
    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    kv_dtype_bytes: int = 2
    param_bytes: int = 0

    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes

    def block_bytes(self, block_size_tokens: int) -> int:
        """One KV block across all layers: one contiguous region in a
        block-first layout."""
        return self.kv_bytes_per_token() * block_size_tokens


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    name: str
    hbm_bytes: int
    h2d_gbps: float
    d2h_gbps: float
    full_duplex: bool

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


# Architectures from the models' published configs (layers, KV heads, head
# dimension); bf16 KV; parameter counts from the model cards.
MODEL_PROFILES: dict[str, ModelProfile] = {
    p.name: p
    for p in (
        ModelProfile("llama-3-8b", 32, 8, 128, 2, int(8.03e9 * 2)),
        ModelProfile("llama-3-70b", 80, 8, 128, 2, int(70.6e9 * 2)),
        ModelProfile("qwen2.5-32b", 64, 8, 128, 2, int(32.8e9 * 2)),
        ModelProfile("mixtral-8x7b", 32, 8, 128, 2, int(46.7e9 * 2)),
    )
}

# Link rates are sustained large-transfer rates, not peak. GH200: the
# SuperInfer paper measures ~180 GB/s per direction with both directions
# busy (Grace DRAM-bound, Table 1). PCIe Gen5 x16: ~55 GB/s per direction
# is what pinned-memory copies sustain (64 GB/s peak).
HARDWARE_PROFILES: dict[str, HardwareProfile] = {
    p.name: p
    for p in (
        HardwareProfile("gh200-144gb", int(144e9), 180.0, 180.0, True),
        HardwareProfile("gh200-96gb", int(96e9), 180.0, 180.0, True),
        HardwareProfile("h100-sxm-80gb", int(80e9), 55.0, 55.0, True),
        HardwareProfile("h200-sxm-141gb", int(141e9), 55.0, 55.0, True),
        HardwareProfile("a100-sxm-80gb", int(80e9), 25.0, 25.0, True),
    )
}
