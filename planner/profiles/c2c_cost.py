"""Cost model of LLM passes with CPU-resident weights on a MIG slice
(C2CServe §3.2, §5): weights stream over the shared C2C link, activations,
outputs and KV cache stay in the slice's HBM. It produces the profiling
tables the serverless policy reads (chunk sizes, the static best rho).

HybridGEMM ``Y[M,N] = X[M,K] · W[K,N]`` with the columns split by rho:

- output-stationary (symmetric) part, rhoN columns: a Y tile stays in
  registers, W is re-read once per row tile of ``sym_block_m`` rows, so its
  C2C traffic is ``rho·|W|·ceil(M / sym_block_m)``; Y is written once;
- weight-stationary (asymmetric) part, (1-rho)N columns: each W tile is read
  once (``(1-rho)·|W|`` over C2C) and reused for every row, while the partial
  outputs are accumulated into Y in HBM once per K slab of ``asym_block_k``:
  ``(1-rho)·accum_bytes·M·N·K / asym_block_k`` of HBM traffic;
- both read X from HBM once per column tile: ``M·K·N·b / block_n``.

Summed over a model's GEMMs, ``Σ K_g·N_g`` is the streamed parameter count
P, so the per-pass totals need no per-GEMM shapes (``Σ N_g`` for the output
writes is taken as P / hidden). A pass takes the roofline
``max(C2C bytes / C2C bandwidth, HBM bytes / HBM bandwidth, FLOPs / compute)``
plus a fixed step overhead; attention adds its KV reads and FLOPs.

Calibration check (docs/serverless.md): K = N = 8192 bf16, M = 6144 with
the link's 405 GB/s gives 15.9 ms output-stationary vs 5.0 ms
weight-stationary on the full GPU (the paper's Fig. 4(a): 16.4 vs 4.0 ms),
the weight-stationary path behind at 3 slices (20 vs 16 ms; the paper:
"similar") and far behind at 7 (40 vs 16 ms; the paper: slower).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from planner.profiles.errors import ProfileError
from planner.profiles.mig import GB, MigSliceProfile
from planner.profiles.models import ModelProfile


@dataclass(frozen=True, slots=True)
class GemmTiles:
    """Tile sizes of a HybridGEMM kernel family."""

    # Output-stationary row tile: W is re-read once per row tile.
    sym_block_m: int = 128
    # Column tile: X is re-read once per column tile.
    block_n: int = 256
    # Weight-stationary K slab: partial outputs are accumulated once per slab.
    asym_block_k: int = 256
    # Bytes of HBM traffic per accumulated output element (fp32 read + write).
    accum_bytes: int = 8


DEFAULT_TILES = GemmTiles()
# Launch and scheduling cost of one engine step (chunk or decode iteration).
DEFAULT_STEP_OVERHEAD_S = 1e-3


class PassCost(NamedTuple):
    """One pass (a GEMM, or a model forward over ``tokens`` tokens). A
    named tuple: replay builds one per simulated iteration."""

    tokens: int
    rho: float
    c2c_bytes: float
    hbm_bytes: float
    flops: float
    c2c_s: float
    hbm_s: float
    compute_s: float
    overhead_s: float
    # HBM-resident weights read as the HBM baselines read theirs: a roofline
    # term of its own beside the activations' and partial sums' HBM traffic
    # (their bytes are in ``hbm_bytes``, their time only here).
    resident_weights_s: float = 0.0

    @property
    def time_s(self) -> float:
        return (
            max(self.c2c_s, self.hbm_s, self.compute_s, self.resident_weights_s) + self.overhead_s
        )

    @property
    def bound(self) -> str:
        """Which resource the roofline binds on: "c2c", "hbm" or "compute"."""
        best = max(self.c2c_s, self.hbm_s, self.compute_s, self.resident_weights_s)
        if best == self.c2c_s:
            return "c2c"
        return "hbm" if best in (self.hbm_s, self.resident_weights_s) else "compute"


def _check(rho: float, c2c_gbps: float) -> None:
    if not 0.0 <= rho <= 1.0:
        raise ProfileError("rho", f"must be in [0, 1], got {rho}")
    if not c2c_gbps > 0:
        raise ProfileError("c2c_gbps", f"must be > 0, got {c2c_gbps}")


def _roofline(  # noqa: PLR0917
    tokens: int,
    rho: float,
    c2c_bytes: float,
    hbm_bytes: float,
    flops: float,
    mig: MigSliceProfile,
    c2c_gbps: float,
    overhead_s: float,
    resident_weight_bytes: float = 0.0,
) -> PassCost:
    """``resident_weight_bytes``: HBM bytes of resident weights among
    ``hbm_bytes`` that get their own roofline term."""
    hbm_bytes_per_s = mig.hbm_bytes_per_s
    return PassCost(
        tokens,
        rho,
        c2c_bytes,
        hbm_bytes,
        flops,
        c2c_bytes / (c2c_gbps * GB),
        (hbm_bytes - resident_weight_bytes) / hbm_bytes_per_s,
        flops / mig.compute_flops_per_s,
        overhead_s,
        resident_weight_bytes / hbm_bytes_per_s,
    )


def gemm_cost(
    m: int,
    k: int,
    n: int,
    *,
    rho: float,
    mig: MigSliceProfile,
    c2c_gbps: float,
    dtype_bytes: int = 2,
    tiles: GemmTiles = DEFAULT_TILES,
    overhead_s: float = 0.0,
) -> PassCost:
    """One HybridGEMM with W (K x N) CPU-resident, X and Y in HBM."""
    _check(rho, c2c_gbps)
    w = float(k) * n * dtype_bytes
    row_tiles = math.ceil(m / tiles.sym_block_m)
    c2c = w * (rho * row_tiles + (1.0 - rho))
    x_reads = float(m) * k * n * dtype_bytes / tiles.block_n
    y_writes = rho * m * n * dtype_bytes
    accumulate = (1.0 - rho) * tiles.accum_bytes * float(m) * n * k / tiles.asym_block_k
    return _roofline(
        m, rho, c2c, x_reads + y_writes + accumulate, 2.0 * m * k * n, mig, c2c_gbps, overhead_s
    )


def model_pass_cost(
    model: ModelProfile,
    tokens: int,
    *,
    rho: float,
    mig: MigSliceProfile,
    c2c_gbps: float,
    attended_pairs: float = 0.0,
    kv_read_tokens: float = 0.0,
    tiles: GemmTiles = DEFAULT_TILES,
    overhead_s: float = DEFAULT_STEP_OVERHEAD_S,
    resident_fraction: float = 0.0,
    resident_reads_overlap: bool = False,
) -> PassCost:
    """A forward pass of ``tokens`` tokens with the weights CPU-resident,
    but for ``resident_fraction`` of them kept in the slice's HBM (read from
    HBM with the same tiling instead of streamed over C2C).

    The resident weights' HBM reads add to the pass's other HBM traffic;
    with ``resident_reads_overlap`` they get a roofline term of their own
    instead, as an HBM-resident model's weights do when costed with the
    slice's HBM rate as its link (the baselines' pass): at fraction 1 the
    two passes take the same time.

    ``attended_pairs``: (query, key) pairs of attention (FLOPs);
    ``kv_read_tokens``: KV tokens read from HBM (per layer, all layers counted
    by the model's KV bytes per token).
    """
    return ModelPass(model).cost(
        tokens,
        rho=rho,
        mig=mig,
        c2c_gbps=c2c_gbps,
        attended_pairs=attended_pairs,
        kv_read_tokens=kv_read_tokens,
        tiles=tiles,
        overhead_s=overhead_s,
        resident_fraction=resident_fraction,
        resident_reads_overlap=resident_reads_overlap,
    )


class ModelPass:
    """model_pass_cost of one model, the terms its architecture fixes
    (weight bytes read, parameters multiplied per token, KV bytes per
    token, attention FLOPs per pair) counted once: a caller that costs many
    passes of one model keeps one."""

    __slots__ = (
        "_architecture",
        "_attention_flops",
        "_costed",
        "_fixed_weight_bytes",
        "_hidden",
        "_kv_bytes",
        "_matmul_params",
        "_weight_bytes",
        "model",
    )

    def __init__(self, model: ModelProfile) -> None:
        self.model = model
        architecture = model.has_architecture
        self._architecture = architecture
        self._costed = model.param_bytes > 0 or architecture
        self._weight_bytes = model.weight_dtype_bytes
        self._hidden = model.hidden_size
        # The weight bytes a pass reads, unless they depend on its tokens
        # (a mixture of experts: the experts they touch).
        self._fixed_weight_bytes: float | None = float(model.param_bytes)
        if architecture:
            self._fixed_weight_bytes = None if model.is_moe else model.weights_read_bytes(1)
        self._kv_bytes = model.kv_bytes_per_token() if model.num_layers > 0 else 0
        self._matmul_params = model.matmul_params_per_token() if architecture else 0
        self._attention_flops = model.attention_flops_per_pair() if architecture else 0

    def cost(
        self,
        tokens: int,
        *,
        rho: float,
        mig: MigSliceProfile,
        c2c_gbps: float,
        attended_pairs: float = 0.0,
        kv_read_tokens: float = 0.0,
        tiles: GemmTiles = DEFAULT_TILES,
        overhead_s: float = DEFAULT_STEP_OVERHEAD_S,
        resident_fraction: float = 0.0,
        resident_reads_overlap: bool = False,
    ) -> PassCost:
        """model_pass_cost(self.model, tokens, ...)."""
        _check(rho, c2c_gbps)
        if not 0.0 <= resident_fraction <= 1.0:
            raise ProfileError("resident_fraction", f"must be in [0, 1], got {resident_fraction}")
        if tokens <= 0:
            raise ProfileError("tokens", f"must be > 0, got {tokens}")
        if not self._costed:
            raise ProfileError("model.param_bytes", "must be > 0 (or give the architecture)")
        b = self._weight_bytes
        w = self._fixed_weight_bytes
        if w is None:
            w = self.model.weights_read_bytes(tokens)
        p = w / b
        row_tiles = math.ceil(tokens / tiles.sym_block_m)
        weight_reads = w * (rho * row_tiles + (1.0 - rho))
        c2c = weight_reads * (1.0 - resident_fraction)
        x_reads = float(tokens) * b * p / tiles.block_n
        out_cols = p / self._hidden if self._hidden > 0 else 0.0
        y_writes = rho * tokens * out_cols * b
        accumulate = (1.0 - rho) * tiles.accum_bytes * float(tokens) * p / tiles.asym_block_k
        kv_traffic = (kv_read_tokens + tokens) * self._kv_bytes
        if self._architecture:
            linear_flops = 2.0 * tokens * self._matmul_params
            attn_flops = attended_pairs * self._attention_flops
        else:
            linear_flops = 2.0 * tokens * p
            attn_flops = 0.0
        resident_reads = weight_reads * resident_fraction
        return _roofline(
            tokens,
            rho,
            c2c,
            x_reads + y_writes + accumulate + kv_traffic + resident_reads,
            linear_flops + attn_flops,
            mig,
            c2c_gbps,
            overhead_s,
            resident_reads if resident_reads_overlap else 0.0,
        )


def required_c2c_gbps(weight_bytes: float, tpot_s: float) -> float:
    """C2C bandwidth a model needs to stream its weights once per decode
    step within its TPOT target: W / TPOT (GB/s)."""
    if not tpot_s > 0:
        raise ProfileError("tpot_s", f"must be > 0, got {tpot_s}")
    return weight_bytes / tpot_s / GB


def decode_step_cost(
    model: ModelProfile,
    *,
    batch: int,
    context_tokens: int,
    rho: float,
    mig: MigSliceProfile,
    c2c_gbps: float,
    tiles: GemmTiles = DEFAULT_TILES,
) -> PassCost:
    """One decode iteration of ``batch`` requests of ``context_tokens`` each."""
    return model_pass_cost(
        model,
        batch,
        rho=rho,
        mig=mig,
        c2c_gbps=c2c_gbps,
        attended_pairs=float(batch) * context_tokens,
        kv_read_tokens=float(batch) * context_tokens,
        tiles=tiles,
    )


@dataclass(frozen=True, slots=True)
class ChunkRow:
    """One row of the chunk-size profiling table: a prompt prefilled in chunks."""

    chunk_tokens: int
    chunks: int
    # Estimated time to first token (all chunks, step overheads included).
    ttft_s: float
    # Totals over the prompt.
    c2c_bytes: float
    hbm_bytes: float
    flops: float
    # The largest chunk alone: its time and its C2C rate (the burst it puts
    # on the shared link).
    chunk_time_s: float
    burst_c2c_gbps: float


def prefill_cost(
    model: ModelProfile,
    *,
    prompt_tokens: int,
    chunk_tokens: int,
    rho: float,
    mig: MigSliceProfile,
    c2c_gbps: float,
    tiles: GemmTiles = DEFAULT_TILES,
    overhead_s: float = DEFAULT_STEP_OVERHEAD_S,
) -> ChunkRow:
    """Prefill of one prompt in chunks of ``chunk_tokens`` (the last one
    shorter); each chunk streams the weights again."""
    if prompt_tokens <= 0:
        raise ProfileError("prompt_tokens", f"must be > 0, got {prompt_tokens}")
    if chunk_tokens <= 0:
        raise ProfileError("chunk_tokens", f"must be > 0, got {chunk_tokens}")
    ttft = c2c = hbm = flops = 0.0
    first: PassCost | None = None
    start = 0
    chunks = 0
    while start < prompt_tokens:
        size = min(chunk_tokens, prompt_tokens - start)
        cost = model_pass_cost(
            model,
            size,
            rho=rho,
            mig=mig,
            c2c_gbps=c2c_gbps,
            # Each new token attends to the prefix and half of its own chunk.
            attended_pairs=float(size) * (start + size / 2.0),
            kv_read_tokens=float(start),
            tiles=tiles,
            overhead_s=overhead_s,
        )
        first = first or cost
        ttft += cost.time_s
        c2c += cost.c2c_bytes
        hbm += cost.hbm_bytes
        flops += cost.flops
        start += size
        chunks += 1
    assert first is not None
    return ChunkRow(
        chunk_tokens=chunk_tokens,
        chunks=chunks,
        ttft_s=ttft,
        c2c_bytes=c2c,
        hbm_bytes=hbm,
        flops=flops,
        chunk_time_s=first.time_s,
        burst_c2c_gbps=first.c2c_bytes / first.time_s / GB,
    )


DEFAULT_CHUNK_SIZES = (128, 256, 512, 1024, 2048, 4096, 8192)


def chunk_table(
    model: ModelProfile,
    mig: MigSliceProfile,
    *,
    prompt_tokens: int,
    c2c_gbps: float,
    rho: float = 0.0,
    chunk_sizes: tuple[int, ...] = DEFAULT_CHUNK_SIZES,
    tiles: GemmTiles = DEFAULT_TILES,
    overhead_s: float = DEFAULT_STEP_OVERHEAD_S,
) -> tuple[ChunkRow, ...]:
    """The profiling table for one (model, slice): one row per chunk size,
    ascending."""
    return tuple(
        prefill_cost(
            model,
            prompt_tokens=prompt_tokens,
            chunk_tokens=c,
            rho=rho,
            mig=mig,
            c2c_gbps=c2c_gbps,
            tiles=tiles,
            overhead_s=overhead_s,
        )
        for c in sorted(set(chunk_sizes))
    )


def best_static_rho(
    model: ModelProfile,
    tokens: int,
    *,
    mig: MigSliceProfile,
    c2c_gbps: float,
    tiles: GemmTiles = DEFAULT_TILES,
    grid: int = 20,
) -> float:
    """The rho on a grid of ``grid`` steps that minimizes one pass's time (the
    offline optimum the online tuner starts from when asked to)."""
    candidates = [i / grid for i in range(grid + 1)]
    times = [
        model_pass_cost(model, tokens, rho=r, mig=mig, c2c_gbps=c2c_gbps, tiles=tiles).time_s
        for r in candidates
    ]
    return candidates[min(range(len(times)), key=lambda i: (times[i], candidates[i]))]


# HBM a slice keeps for the runtime besides weights and KV cache: the CUDA
# context and workspaces, and the activations of one prefill chunk (a
# 2,048-token chunk of an 8B model: ~0.2 GB). Our estimate, not measured.
RUNTIME_RESERVE_BYTES = 1.5e9
# Fraction of a slice's HBM the engine uses (vLLM's and SGLang's default).
DEFAULT_MEMORY_UTILIZATION = 0.9


def kv_capacity_tokens(
    model: ModelProfile,
    mig: MigSliceProfile,
    *,
    weights_in_hbm: bool,
    memory_utilization: float = DEFAULT_MEMORY_UTILIZATION,
    reserve_bytes: float = RUNTIME_RESERVE_BYTES,
) -> int:
    """KV tokens one slice holds: its HBM x utilization, less the runtime
    reserve and, when the weights are resident (not streamed), the weights;
    0 when they do not fit."""
    if not 0.0 < memory_utilization <= 1.0:
        raise ProfileError("memory_utilization", f"must be in (0, 1], got {memory_utilization}")
    per_token = model.kv_bytes_per_token()
    if per_token <= 0:
        raise ProfileError("model", f"{model.name} has no KV bytes per token")
    free = mig.hbm_bytes * memory_utilization - reserve_bytes
    if weights_in_hbm:
        free -= model.param_bytes
    return max(0, int(free // per_token))
