"""HybridGEMM (C2CServe §5): ``Y = X·W`` with X in GPU memory and W possibly in
host-mapped memory, the output columns split by a knob rho:

- columns ``[0, rho·N)``: output-stationary tiles (a Y tile stays in registers
  while X and W tiles stream past; W is re-read once per row tile);
- columns ``[rho·N, N)``: weight-stationary tiles (each W tile is loaded once and
  reused for every row tile; partial outputs are accumulated into Y in
  memory, trading link traffic for HBM traffic).

Both paths accumulate in fp32 over the same K tiles in the same order, so the
result does not depend on rho. This module holds the split and the torch
reference; ``triton_gemm`` the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SUPPORTED = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True, slots=True)
class Tiles:
    """One kernel's tile sizes (powers of two, each >= 16) and launch shape."""

    m: int = 32
    n: int = 32
    k: int = 32
    warps: int = 4
    stages: int = 3

    def launch(self) -> dict[str, int]:
        return {"BM": self.m, "BN": self.n, "BK": self.k, "num_warps": self.warps,
                "num_stages": self.stages}  # fmt: skip


def split_columns(n: int, rho: float) -> int:
    """The output-stationary width ``round(rho·N)``."""
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"rho must be in [0, 1], got {rho}")
    return round(rho * n)


def check_operands(x: torch.Tensor, w: torch.Tensor) -> None:
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(f"cannot multiply {tuple(x.shape)} by {tuple(w.shape)}")
    if x.dtype != w.dtype or x.dtype not in SUPPORTED:
        raise ValueError(f"operands must share a dtype among {SUPPORTED}: {x.dtype}, {w.dtype}")


def hybrid_gemm_reference(
    x: torch.Tensor, w: torch.Tensor, rho: float = 1.0, *, block_k: int | None = None
) -> torch.Tensor:
    """fp32-accumulated ``X·W`` in X's dtype; the output-stationary part in one
    product, the weight-stationary part as partial products over K tiles of
    ``block_k`` added into an fp32 Y (its dataflow, not its speed)."""
    check_operands(x, w)
    n_sym = split_columns(w.shape[1], rho)
    xf = x.float()
    wf = w.to(device=x.device, dtype=torch.float32)
    y = torch.zeros(x.shape[0], w.shape[1], dtype=torch.float32, device=x.device)
    y[:, :n_sym] = xf @ wf[:, :n_sym]
    step = block_k or max(1, w.shape[0])
    for k in range(0, w.shape[0], step):
        y[:, n_sym:] += xf[:, k : k + step] @ wf[k : k + step, n_sym:]
    return y.to(x.dtype)
