"""Baselines for the benchmark: one copy call per piece, as vLLM does.

- per segment: one copy per (layer, K/V, block); in a layer-first cache a
  segment is the largest contiguous piece (SuperInfer's "Naive").
- per block: one copy per block of a block-first cache ("MS": merged
  segments, still one launch each).
- per extent: one copy per contiguous extent of a block-first cache.
On CUDA each copy is a ``cudaMemcpyAsync`` on the current stream.
"""

from __future__ import annotations

import torch

from .extents import block_copies, check_bounds
from .layout import KVLayout
from .transfer_batch import TransferBatch


def _non_blocking(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.device.type == "cuda" or b.device.type == "cuda"


def copy_per_segment(
    src_cache: torch.Tensor, dst_cache: torch.Tensor, layout: KVLayout, batch: TransferBatch
) -> int:
    """Copies every segment of the batch's blocks separately; returns the
    number of copy calls."""
    copies = block_copies(batch)
    nb = _non_blocking(src_cache, dst_cache)
    calls = 0
    if layout is KVLayout.LAYER_FIRST:
        layers = src_cache.shape[0]
        check_bounds(batch, src_cache.shape[2], dst_cache.shape[2])
    else:
        layers = src_cache.shape[1]
        check_bounds(batch, src_cache.shape[0], dst_cache.shape[0])
    for s, d in zip(copies.src.tolist(), copies.dst.tolist(), strict=True):
        for layer in range(layers):
            for kv in range(2):
                if layout is KVLayout.LAYER_FIRST:
                    dst_cache[layer, kv, d].copy_(src_cache[layer, kv, s], non_blocking=nb)
                else:
                    dst_cache[d, layer, kv].copy_(src_cache[s, layer, kv], non_blocking=nb)
                calls += 1
    return calls


def copy_per_block(src_pool: torch.Tensor, dst_pool: torch.Tensor, batch: TransferBatch) -> int:
    """Block-first pools: one copy per block."""
    check_bounds(batch, src_pool.shape[0], dst_pool.shape[0])
    copies = block_copies(batch)
    nb = _non_blocking(src_pool, dst_pool)
    for s, d in zip(copies.src.tolist(), copies.dst.tolist(), strict=True):
        dst_pool[d].copy_(src_pool[s], non_blocking=nb)
    return len(copies)


def copy_per_extent(src_pool: torch.Tensor, dst_pool: torch.Tensor, batch: TransferBatch) -> int:
    """Block-first pools: one copy per contiguous extent."""
    check_bounds(batch, src_pool.shape[0], dst_pool.shape[0])
    nb = _non_blocking(src_pool, dst_pool)
    for e in batch.extents:
        dst_pool[e.dst_start : e.dst_start + e.num_blocks].copy_(
            src_pool[e.src_start : e.src_start + e.num_blocks], non_blocking=nb
        )
    return len(batch.extents)
