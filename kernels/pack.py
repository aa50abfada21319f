"""AQUA's gather: many small tensors packed into one buffer so that one large
copy moves them (small copies waste the link), and the inverse scatter.

``pack_layout`` fixes where each tensor goes (element offsets, in order);
``gather_reference`` / ``scatter_reference`` are the torch references and
``triton_pack.gather`` / ``triton_pack.scatter`` the one-launch kernels.
Tensors are contiguous and share the buffer's dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class PackLayout:
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def total(self) -> int:
        return self.offsets[-1] + self.sizes[-1] if self.sizes else 0


def pack_layout(tensors: Sequence[torch.Tensor], align: int = 1) -> PackLayout:
    """Back-to-back offsets, each rounded up to a multiple of ``align`` elements."""
    offsets: list[int] = []
    at = 0
    for t in tensors:
        at = -(-at // align) * align
        offsets.append(at)
        at += t.numel()
    return PackLayout(tuple(offsets), tuple(t.numel() for t in tensors))


def check_packable(
    tensors: Sequence[torch.Tensor], buffer: torch.Tensor, layout: PackLayout
) -> None:
    if len(tensors) != len(layout.sizes):
        raise ValueError(f"{len(tensors)} tensors for a layout of {len(layout.sizes)}")
    if buffer.numel() < layout.total or not buffer.is_contiguous():
        raise ValueError(f"buffer of {buffer.numel()} elements, layout needs {layout.total}")
    for i, t in enumerate(tensors):
        if t.dtype != buffer.dtype or not t.is_contiguous() or t.numel() != layout.sizes[i]:
            raise ValueError(f"tensor {i} ({t.dtype}, {tuple(t.shape)}) does not fit the layout")


def gather_reference(
    tensors: Sequence[torch.Tensor], buffer: torch.Tensor, layout: PackLayout
) -> None:
    check_packable(tensors, buffer, layout)
    flat = buffer.view(-1)
    for t, off in zip(tensors, layout.offsets, strict=True):
        flat[off : off + t.numel()].copy_(t.view(-1))


def scatter_reference(
    buffer: torch.Tensor, tensors: Sequence[torch.Tensor], layout: PackLayout
) -> None:
    check_packable(tensors, buffer, layout)
    flat = buffer.view(-1)
    for t, off in zip(tensors, layout.offsets, strict=True):
        t.view(-1).copy_(flat[off : off + t.numel()])
