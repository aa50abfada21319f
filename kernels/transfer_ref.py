"""Reference block copy: ``index_select`` then ``index_copy_`` (one gather
and one scatter per direction). Any two block-first pools with the same
per-block shape, on any devices."""

from __future__ import annotations

import torch

from .extents import block_copies, check_bounds
from .transfer_batch import TransferBatch


def copy_blocks_reference(
    src_pool: torch.Tensor, dst_pool: torch.Tensor, src_ids: torch.Tensor, dst_ids: torch.Tensor
) -> None:
    if src_pool.shape[1:] != dst_pool.shape[1:]:
        raise ValueError(f"pools differ per block: {src_pool.shape} vs {dst_pool.shape}")
    rows = src_pool.index_select(0, src_ids.to(src_pool.device))
    dst_pool.index_copy_(0, dst_ids.to(dst_pool.device), rows.to(dst_pool.device))


def run_batch_reference(
    src_pool: torch.Tensor, dst_pool: torch.Tensor, batch: TransferBatch
) -> None:
    check_bounds(batch, src_pool.shape[0], dst_pool.shape[0])
    copies = block_copies(batch)
    if len(copies):
        copy_blocks_reference(src_pool, dst_pool, copies.src, copies.dst)
