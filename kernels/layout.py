"""KV cache layouts (DESIGN.md §5, SuperInfer §4.3.2).

Layer-first (vLLM): ``(L, 2, num_blocks, block_size, H_kv, D)``; one block of
one layer's K (or V) is a contiguous *segment*, and a block's data across all
layers is 2·L segments scattered through memory.

Block-first (SuperInfer): ``(num_blocks, L, 2, block_size, H_kv, D)``; a
block across all layers is one contiguous region, so a transfer of a block is
one copy. Attention reads layer ``l`` through a strided view whose block
stride is ``L·2`` segments instead of one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class KVLayout(enum.StrEnum):
    LAYER_FIRST = "layer_first"
    BLOCK_FIRST = "block_first"


@dataclass(frozen=True, slots=True)
class KVShape:
    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int

    def dims(self, layout: KVLayout) -> tuple[int, ...]:
        tail = (self.block_size, self.num_kv_heads, self.head_dim)
        if layout is KVLayout.LAYER_FIRST:
            return (self.num_layers, 2, self.num_blocks, *tail)
        return (self.num_blocks, self.num_layers, 2, *tail)

    @property
    def segment_elems(self) -> int:
        """Elements of one (layer, K or V, block) segment."""
        return self.block_size * self.num_kv_heads * self.head_dim

    @property
    def block_elems(self) -> int:
        """Elements of one block across all layers, K and V."""
        return self.num_layers * 2 * self.segment_elems

    def with_blocks(self, num_blocks: int) -> KVShape:
        return KVShape(
            self.num_layers, num_blocks, self.block_size, self.num_kv_heads, self.head_dim
        )


def allocate(
    shape: KVShape,
    layout: KVLayout,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    pin: bool = False,
    fill: float | None = None,
) -> torch.Tensor:
    """A cache of ``shape`` in ``layout``; ``pin`` page-locks a CPU cache
    (only where CUDA is available); ``fill`` poisons it (e.g. NaN)."""
    dev = torch.device(device)
    pin = pin and dev.type == "cpu" and torch.cuda.is_available()
    cache = torch.empty(shape.dims(layout), dtype=dtype, device=dev, pin_memory=pin)
    if fill is not None:
        cache.fill_(fill)
    return cache


def shape_of(cache: torch.Tensor, layout: KVLayout) -> KVShape:
    if cache.dim() != 6:
        raise ValueError(f"a KV cache has 6 dimensions, got {tuple(cache.shape)}")
    if layout is KVLayout.LAYER_FIRST:
        layers, kv, blocks, bs, heads, dim = cache.shape
    else:
        blocks, layers, kv, bs, heads, dim = cache.shape
    if kv != 2:
        raise ValueError(f"the K/V dimension must be 2, got {kv}")
    return KVShape(layers, blocks, bs, heads, dim)


def to_block_first(cache: torch.Tensor) -> torch.Tensor:
    """A contiguous block-first copy of a layer-first cache."""
    return cache.permute(2, 0, 1, 3, 4, 5).contiguous()


def to_layer_first(cache: torch.Tensor) -> torch.Tensor:
    """A contiguous layer-first copy of a block-first cache."""
    return cache.permute(1, 2, 0, 3, 4, 5).contiguous()


def convert(cache: torch.Tensor, src: KVLayout, dst: KVLayout) -> torch.Tensor:
    if src is dst:
        return cache
    return to_block_first(cache) if dst is KVLayout.BLOCK_FIRST else to_layer_first(cache)


def layer_kv(
    cache: torch.Tensor, layout: KVLayout, layer: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Views ``(num_blocks, block_size, H_kv, D)`` of one layer's K and V; no
    copy. In block-first the block stride is ``L·2·segment`` elements."""
    if layout is KVLayout.LAYER_FIRST:
        return cache[layer, 0], cache[layer, 1]
    return cache[:, layer, 0], cache[:, layer, 1]


def block_rows(pool: torch.Tensor) -> torch.Tensor:
    """A contiguous block-first pool as ``(num_blocks, block_elems)``."""
    if not pool.is_contiguous():
        raise ValueError("block copies need a contiguous block-first pool")
    return pool.view(pool.shape[0], -1)
