"""Kernel-family choice (C2CServe §6.4): the prebuilt HybridGEMM family
matching the model's precision, the pass shape (decode: few rows; prefill:
many) and the slice (small slices, with little HBM bandwidth, take a deeper
weight-stationary K slab: fewer partial-output accumulations in HBM). The
knob starts at rho = 0, the C2C-frugal weight-stationary path; the tuner
moves it online."""

from __future__ import annotations

from dataclasses import dataclass

from planner.domain.serverless import KernelChoice
from planner.profiles.c2c_cost import GemmTiles, best_static_rho
from planner.profiles.mig import MigSliceProfile
from planner.profiles.models import ModelProfile

PRECISIONS = ("bf16", "fp16", "fp8")
# Passes of at most this many rows use the decode families.
DECODE_MAX_TOKENS = 64
# Slices with at most this HBM bandwidth (GB/s) use the deep-K families.
SMALL_SLICE_HBM_GBPS = 1000.0


@dataclass(frozen=True, slots=True)
class KernelFamily:
    name: str
    precision: str
    shape: str
    small_slice: bool
    tiles: GemmTiles


def _families() -> dict[tuple[str, str, bool], KernelFamily]:
    out = {}
    for precision in PRECISIONS:
        for shape, block_m in (("decode", 64), ("prefill", 128)):
            for small, block_k in ((False, 256), (True, 512)):
                name = f"hybrid_gemm.{precision}.{shape}.m{block_m}n256k{block_k}"
                out[(precision, shape, small)] = KernelFamily(
                    name, precision, shape, small, GemmTiles(block_m, 256, block_k)
                )
    return out


KERNEL_REPOSITORY = _families()


def choose_kernel(
    *,
    precision: str,
    tokens: int,
    mig: MigSliceProfile,
    model: ModelProfile | None = None,
    c2c_gbps: float = 0.0,
) -> KernelChoice:
    """The family for this (precision, pass shape, slice); with a model and
    the slice's C2C share, also the cost model's static best rho."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if tokens <= 0:
        raise ValueError(f"tokens must be > 0, got {tokens}")
    shape = "decode" if tokens <= DECODE_MAX_TOKENS else "prefill"
    small = mig.hbm_gbps <= SMALL_SLICE_HBM_GBPS
    family = KERNEL_REPOSITORY[(precision, shape, small)]
    best = 0.0
    if model is not None and c2c_gbps > 0:
        best = best_static_rho(model, tokens, mig=mig, c2c_gbps=c2c_gbps, tiles=family.tiles)
    t = family.tiles
    return KernelChoice(
        family=family.name,
        precision=precision,
        shape=shape,
        sym_block_m=t.sym_block_m,
        block_n=t.block_n,
        asym_block_k=t.asym_block_k,
        initial_rho=0.0,
        model_best_rho=best,
        reason=(
            f"{shape} pass of {tokens} tokens on a {mig.sms}-SM slice with "
            f"{mig.hbm_gbps:g} GB/s of HBM; rho starts at 0 (C2C-frugal)"
        ),
    )
