"""HybridGEMM in Triton (see ``hybrid_gemm``): two launches that write disjoint
columns of Y, so they need no synchronization between them.

The output-stationary kernel is a plain tiled GEMM over ``[0, n_sym)``. The
weight-stationary kernel gives each program one column tile of
``[n_sym, N)``; for every K tile it loads the W tile once and sweeps all row
tiles, adding ``X_tile · W_tile`` into an fp32 Y held in memory. Both use
``tl.dot(a, b, acc)`` over the same K tiles in the same order: the same fp32
additions, so with one K tile for both the result is independent of rho. A
larger K tile for the weight-stationary kernel reads and writes its fp32 Y
fewer times (K / tile passes), which is what makes it fast on a GPU; then Y
agrees with the other split to fp32 rounding, not bit for bit.

W may be a page-locked CPU tensor (host-mapped, read over the link). Under
the Triton interpreter (CPU) bf16 tiles are widened to fp32 before ``tl.dot``:
triton 3.8's interpreter multiplies bf16 operands as raw 16-bit integers.
bf16 products are exact in fp32, so this does not change the result; and it
narrows fp32 to bf16 by truncation, so there the output-stationary tiles are
stored in fp32 and rounded by torch.
"""

# Triton's convention: compile-time constants are upper case.
# ruff: noqa: N803, PLR0917

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from .hybrid_gemm import Tiles, check_operands, split_columns
from .triton_support import interpreting


@triton.jit
def _output_stationary(
    x,
    w,
    y,
    M,
    K,
    n_end,
    sxm,
    sxk,
    swk,
    swn,
    sym,
    syn,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    WIDEN: tl.constexpr,
    PRECISION: tl.constexpr,
):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(
            x + rm[:, None] * sxm + rk[None, :] * sxk,
            mask=(rm[:, None] < M) & (rk[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            w + rk[:, None] * swk + rn[None, :] * swn,
            mask=(rk[:, None] < K) & (rn[None, :] < n_end),
            other=0.0,
        )
        if WIDEN:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    tl.store(
        y + rm[:, None] * sym + rn[None, :] * syn,
        acc.to(y.dtype.element_ty),
        mask=(rm[:, None] < M) & (rn[None, :] < n_end),
    )


@triton.jit
def _weight_stationary(
    x,
    w,
    acc_ptr,
    M,
    K,
    N,
    n_start,
    sxm,
    sxk,
    swk,
    swn,
    sam,
    san,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    WIDEN: tl.constexpr,
    PRECISION: tl.constexpr,
):
    cn = tl.program_id(0) * BN + tl.arange(0, BN)
    rn = n_start + cn
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        b = tl.load(
            w + rk[:, None] * swk + rn[None, :] * swn,
            mask=(rk[:, None] < K) & (rn[None, :] < N),
            other=0.0,
        )
        if WIDEN:
            b = b.to(tl.float32)
        for m0 in range(0, M, BM):
            rm = m0 + tl.arange(0, BM)
            a = tl.load(
                x + rm[:, None] * sxm + rk[None, :] * sxk,
                mask=(rm[:, None] < M) & (rk[None, :] < K),
                other=0.0,
            )
            if WIDEN:
                a = a.to(tl.float32)
            out = acc_ptr + rm[:, None] * sam + cn[None, :] * san
            omask = (rm[:, None] < M) & (rn[None, :] < N)
            part = tl.load(out, mask=omask, other=0.0)
            part = tl.dot(a, b, part, input_precision=PRECISION)
            tl.store(out, part, mask=omask)


DEFAULT_TILES = Tiles()

_side_streams: dict[torch.device, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    if device not in _side_streams:
        _side_streams[device] = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
    return _side_streams[device]


def hybrid_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    rho: float,
    *,
    tiles: Tiles = DEFAULT_TILES,
    ws_tiles: Tiles | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``X·W`` in X's dtype with fp32 accumulation; columns ``[0, round(rho·N))``
    output-stationary (``tiles``), the rest weight-stationary (``ws_tiles``,
    default ``tiles``). Y does not depend on rho when both use the same K
    tile. On a GPU the two parts run at once, the weight-stationary one on a
    side stream, and the current stream waits for both."""
    check_operands(x, w)
    m, k = x.shape
    n = w.shape[1]
    n_sym = split_columns(n, rho)
    ws = ws_tiles or tiles
    y = out if out is not None else torch.empty(m, n, dtype=x.dtype, device=x.device)
    widen = interpreting() and x.dtype == torch.bfloat16
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    launch = tiles.launch()
    ws_launch = ws.launch()
    if interpreting():
        for kw in (launch, ws_launch):
            del kw["num_warps"], kw["num_stages"]
    concurrent = x.device.type == "cuda" and 0 < n_sym < n
    current = torch.cuda.current_stream(x.device) if concurrent else None
    if n_sym < n:
        side = _side_stream(x.device) if current is not None else None
        if side is not None and current is not None:
            side.wait_stream(current)
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            acc = torch.zeros(m, n - n_sym, dtype=torch.float32, device=x.device)
            ws_grid = (triton.cdiv(n - n_sym, ws.n),)
            _weight_stationary[ws_grid](
                x, w, acc, m, k, n, n_sym,
                x.stride(0), x.stride(1), w.stride(0), w.stride(1), acc.stride(0), acc.stride(1),
                WIDEN=widen, PRECISION=precision, **ws_launch,
            )  # fmt: skip
            y[:, n_sym:] = acc.to(y.dtype)
    if n_sym > 0:
        # The interpreter also narrows fp32 to bf16 by truncation: there the
        # output-stationary tiles land in fp32 and torch rounds them.
        target = torch.empty(m, n_sym, dtype=torch.float32, device=x.device) if widen else y
        grid: tuple[int, ...] = (triton.cdiv(m, tiles.m), triton.cdiv(n_sym, tiles.n))
        _output_stationary[grid](
            x, w, target, m, k, n_sym,
            x.stride(0), x.stride(1), w.stride(0), w.stride(1), target.stride(0), target.stride(1),
            WIDEN=widen, PRECISION=precision, **launch,
        )  # fmt: skip
        if widen:
            y[:, :n_sym] = target.to(y.dtype)
    if current is not None:
        current.wait_stream(_side_stream(x.device))
    return y
