"""Chunk-size choice (C2CServe §6.3): per (model, slice), the smallest
prefill chunk of the profiling table whose estimated TTFT meets the target
while the HBM traffic and FLOPs it implies over that target fit the slice's
HBM bandwidth and compute. Smaller chunks put shorter bursts on the shared
C2C link; larger ones amortize each weight stream over more tokens."""

from __future__ import annotations

from collections.abc import Sequence

from planner.domain.serverless import ChunkChoice
from planner.profiles.c2c_cost import ChunkRow
from planner.profiles.mig import GB, MigSliceProfile


def choose_chunk(
    table: Sequence[ChunkRow], *, ttft_target_s: float, mig: MigSliceProfile
) -> ChunkChoice:
    """The smallest feasible row; when none is, the fastest row (ties: the
    smaller chunk) with ``meets_target`` False."""
    if not table:
        raise ValueError("the chunk table is empty")
    if not ttft_target_s > 0:
        raise ValueError(f"ttft_target_s must be > 0, got {ttft_target_s}")
    rows = sorted(table, key=lambda r: r.chunk_tokens)

    def needs(row: ChunkRow) -> tuple[float, float]:
        return row.hbm_bytes / ttft_target_s / GB, row.flops / ttft_target_s / 1e12

    hbm_cap = mig.hbm_bytes_per_s / GB
    compute_cap = mig.compute_flops_per_s / 1e12
    for row in rows:
        hbm, compute = needs(row)
        if row.ttft_s <= ttft_target_s and hbm <= hbm_cap and compute <= compute_cap:
            return ChunkChoice(
                row.chunk_tokens,
                True,
                row.ttft_s,
                hbm,
                compute,
                row.burst_c2c_gbps,
                f"smallest chunk meeting TTFT {ttft_target_s:g} s (estimated {row.ttft_s:.3f} s)",
            )
    best = min(rows, key=lambda r: (r.ttft_s, r.chunk_tokens))
    hbm, compute = needs(best)
    return ChunkChoice(
        best.chunk_tokens,
        False,
        best.ttft_s,
        hbm,
        compute,
        best.burst_c2c_gbps,
        f"no chunk meets TTFT {ttft_target_s:g} s on this slice; "
        f"fastest is {best.chunk_tokens} tokens ({best.ttft_s:.3f} s)",
    )
