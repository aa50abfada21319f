"""Triton gather/scatter of whole blocks between two block-first pools: one
launch moves every block of a batch, whatever its extents.

The work is ``n`` blocks of ``chunks`` chunks each; item ``w`` copies chunk
``w % chunks`` of block ``src_ids[w // chunks]`` to block
``dst_ids[w // chunks]``. The grid is persistent: a fixed number of programs
(twice the multiprocessors on a GPU) walk the items with a stride, so one
launch never fills the whole GPU and the other direction's launch on its own
stream runs beside it (DuplexKV); one program per item would occupy every
multiprocessor until the first launch's tail, serializing the two
directions. A page-locked CPU pool is read or written directly by the GPU
(zero-copy), so the same kernel serves D2H and H2D; on CPU it runs under the
Triton interpreter.
"""

# Triton's convention: compile-time constants are upper case.
# ruff: noqa: N803, PLR0917

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .extents import block_copies, check_bounds
from .layout import block_rows
from .transfer_batch import TransferBatch

CHUNK = 4096
PROGRAMS_PER_SM = 2
PROGRAMS_ON_CPU = 8


@triton.jit
def _copy_blocks_kernel(src, dst, src_ids, dst_ids, row_elems, items, chunks, CHUNK: tl.constexpr):
    for w in range(tl.program_id(0), items, tl.num_programs(0)):
        i = w // chunks
        s = tl.load(src_ids + i).to(tl.int64)
        d = tl.load(dst_ids + i).to(tl.int64)
        offs = (w % chunks).to(tl.int64) * CHUNK + tl.arange(0, CHUNK)
        mask = offs < row_elems
        x = tl.load(src + s * row_elems + offs, mask=mask)
        tl.store(dst + d * row_elems + offs, x, mask=mask)


def programs_for(device: torch.device) -> int:
    """The persistent grid's size on ``device``."""
    if device.type != "cuda":
        return PROGRAMS_ON_CPU
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return PROGRAMS_PER_SM * int(sms)


def _words(rows: torch.Tensor) -> torch.Tensor:
    """Rows reinterpreted as the widest integer that divides a row."""
    nbytes = rows.shape[1] * rows.element_size()
    for dtype, size in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        if nbytes % size == 0:
            return rows.view(torch.uint8).view(dtype)
    return rows.view(torch.uint8)


def copy_blocks_triton(
    src_pool: torch.Tensor,
    dst_pool: torch.Tensor,
    src_ids: torch.Tensor,
    dst_ids: torch.Tensor,
    *,
    chunk: int = CHUNK,
    programs: int | None = None,
) -> None:
    """Block ``src_ids[i]`` of ``src_pool`` to block ``dst_ids[i]`` of
    ``dst_pool``, in one launch on the current stream."""
    if src_pool.shape[1:] != dst_pool.shape[1:] or src_pool.dtype != dst_pool.dtype:
        raise ValueError(f"pools differ per block: {src_pool.shape} vs {dst_pool.shape}")
    n = int(src_ids.numel())
    if n == 0:
        return
    src = _words(block_rows(src_pool))
    dst = _words(block_rows(dst_pool))
    device = dst_pool.device if dst_pool.device.type == "cuda" else src_pool.device
    sid = src_ids.to(device=device, dtype=torch.int64)
    did = dst_ids.to(device=device, dtype=torch.int64)
    row = src.shape[1]
    chunks = triton.cdiv(row, chunk)
    items = n * chunks
    grid = (max(1, min(items, programs or programs_for(device))),)
    _copy_blocks_kernel[grid](src, dst, sid, did, row, items, chunks, CHUNK=chunk)


def run_batch_triton(src_pool: torch.Tensor, dst_pool: torch.Tensor, batch: TransferBatch) -> None:
    check_bounds(batch, src_pool.shape[0], dst_pool.shape[0])
    copies = block_copies(batch)
    copy_blocks_triton(src_pool, dst_pool, copies.src, copies.dst)
