"""AQUA's gather/scatter as one Triton launch each: a table of the small
tensors' addresses, sizes and buffer offsets; program ``(i, c)`` copies chunk
``c`` of tensor ``i``. The tensors may live in GPU memory or page-locked host
memory; on CPU the kernels run under the Triton interpreter."""

# Triton's convention: compile-time constants are upper case.
# ruff: noqa: N803, PLR0917

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from .pack import PackLayout, check_packable

CHUNK = 1024


@triton.jit
def _pack_kernel(addrs, sizes, offsets, buffer, TO_BUFFER: tl.constexpr, CHUNK: tl.constexpr):
    i = tl.program_id(0)
    c = tl.program_id(1)
    ptr = tl.load(addrs + i).to(tl.pointer_type(buffer.dtype.element_ty))
    n = tl.load(sizes + i)
    at = tl.load(offsets + i)
    r = c.to(tl.int64) * CHUNK + tl.arange(0, CHUNK)
    mask = r < n
    if TO_BUFFER:
        tl.store(buffer + at + r, tl.load(ptr + r, mask=mask), mask=mask)
    else:
        tl.store(ptr + r, tl.load(buffer + at + r, mask=mask), mask=mask)


def _launch(
    tensors: Sequence[torch.Tensor], buffer: torch.Tensor, layout: PackLayout, to_buffer: bool
) -> None:
    check_packable(tensors, buffer, layout)
    if not tensors:
        return
    on_gpu = [x.device for x in (buffer, *tensors) if x.device.type == "cuda"]
    device = on_gpu[0] if on_gpu else buffer.device
    table = torch.tensor(
        [[t.data_ptr() for t in tensors], list(layout.sizes), list(layout.offsets)],
        dtype=torch.int64,
    ).to(device)
    if max(layout.sizes) == 0:
        return
    grid = (len(tensors), triton.cdiv(max(layout.sizes), CHUNK))
    _pack_kernel[grid](table[0], table[1], table[2], buffer, TO_BUFFER=to_buffer, CHUNK=CHUNK)


def gather(tensors: Sequence[torch.Tensor], buffer: torch.Tensor, layout: PackLayout) -> None:
    """Every tensor into its span of ``buffer``, in one launch."""
    _launch(tensors, buffer, layout, True)


def scatter(buffer: torch.Tensor, tensors: Sequence[torch.Tensor], layout: PackLayout) -> None:
    """Every span of ``buffer`` back into its tensor, in one launch."""
    _launch(tensors, buffer, layout, False)
