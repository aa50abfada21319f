"""The block copies a rotation plan asks of the kernels: plain data, no torch.

The rotation policy returns them inside its plan
(``planner.domain.rotation.RotationPlan.batches``); the kernels consume them.
They live here so that the kernels import nothing of the planner
(DESIGN.md §1).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class CopyDirection(enum.IntEnum):
    D2H = 1
    H2D = 2


@dataclass(frozen=True, slots=True)
class BlockExtent:
    src_start: int
    dst_start: int
    num_blocks: int


@dataclass(frozen=True, slots=True)
class TransferBatch:
    direction: CopyDirection
    extents: tuple[BlockExtent, ...]
    num_blocks: int
    num_bytes: int
