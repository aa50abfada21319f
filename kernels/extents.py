"""A rotation plan's transfer batches as the kernels consume them.

``TransferBatch`` (transfer_batch) lists extents ``(src_start,
dst_start, num_blocks)``: for D2H the source ids are GPU blocks and the
destination ids CPU blocks, for H2D the reverse. Block-first layout makes each
block one contiguous region of every pool, so an extent is one contiguous
span on both sides.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from .transfer_batch import BlockExtent, CopyDirection, TransferBatch


@dataclass(frozen=True, slots=True)
class BlockCopies:
    """One direction's copies, block by block: ``src[i]`` to ``dst[i]``."""

    direction: CopyDirection
    src: torch.Tensor
    dst: torch.Tensor

    def __len__(self) -> int:
        return int(self.src.numel())

    def gpu_ids(self) -> torch.Tensor:
        return self.src if self.direction is CopyDirection.D2H else self.dst


def block_copies(batch: TransferBatch) -> BlockCopies:
    """The extents of ``batch`` expanded into per-block id tensors (int64)."""
    src: list[int] = []
    dst: list[int] = []
    for e in batch.extents:
        if e.num_blocks <= 0:
            raise ValueError(f"extent with {e.num_blocks} blocks: {e}")
        src.extend(range(e.src_start, e.src_start + e.num_blocks))
        dst.extend(range(e.dst_start, e.dst_start + e.num_blocks))
    return BlockCopies(
        batch.direction, torch.tensor(src, dtype=torch.long), torch.tensor(dst, dtype=torch.long)
    )


def make_batch(
    direction: CopyDirection, pairs: Iterable[tuple[int, int]], block_bytes: int = 0
) -> TransferBatch:
    """(src, dst) block pairs as a batch of maximal extents, as the policy
    builds them (consecutive on both sides merge)."""
    extents: list[BlockExtent] = []
    count = 0
    for src, dst in sorted(pairs):
        count += 1
        last = extents[-1] if extents else None
        if (
            last is not None
            and src == last.src_start + last.num_blocks
            and dst == last.dst_start + last.num_blocks
        ):
            extents[-1] = BlockExtent(last.src_start, last.dst_start, last.num_blocks + 1)
        else:
            extents.append(BlockExtent(src, dst, 1))
    return TransferBatch(direction, tuple(extents), count, count * block_bytes)


def by_direction(
    batches: Sequence[TransferBatch],
) -> tuple[TransferBatch | None, TransferBatch | None]:
    """(D2H, H2D): a plan has at most one batch per direction; several of one
    direction are joined into one."""
    found: dict[CopyDirection, list[TransferBatch]] = {}
    for b in batches:
        found.setdefault(b.direction, []).append(b)
    out: list[TransferBatch | None] = []
    for direction in (CopyDirection.D2H, CopyDirection.H2D):
        group = found.get(direction, [])
        if not group:
            out.append(None)
        elif len(group) == 1:
            out.append(group[0])
        else:
            out.append(
                TransferBatch(
                    direction,
                    tuple(e for b in group for e in b.extents),
                    sum(b.num_blocks for b in group),
                    sum(b.num_bytes for b in group),
                )
            )
    return out[0], out[1]


class RaceError(ValueError):
    """An H2D copy would overwrite a GPU block that a D2H copy of the same
    iteration still reads (DESIGN.md §3.1 invariant)."""


def check_race_free(d2h: TransferBatch | None, h2d: TransferBatch | None) -> None:
    if d2h is None or h2d is None:
        return
    sources = {i for e in d2h.extents for i in range(e.src_start, e.src_start + e.num_blocks)}
    clash = sorted(
        i
        for e in h2d.extents
        for i in range(e.dst_start, e.dst_start + e.num_blocks)
        if i in sources
    )
    if clash:
        raise RaceError(f"H2D destinations are D2H sources in flight: GPU blocks {clash[:8]}")


def check_bounds(batch: TransferBatch, src_blocks: int, dst_blocks: int) -> None:
    for e in batch.extents:
        if e.src_start < 0 or e.src_start + e.num_blocks > src_blocks:
            raise IndexError(f"source extent {e} outside a pool of {src_blocks} blocks")
        if e.dst_start < 0 or e.dst_start + e.num_blocks > dst_blocks:
            raise IndexError(f"destination extent {e} outside a pool of {dst_blocks} blocks")
