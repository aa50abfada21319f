"""Our prefill cost against the TTFT numbers the C2CServe paper prints
(docs/serverless.md, "The 95 % TTFT claim"), Llama-3-8B, the paper's TTFT
figures (0.15 s, 0.64 s, 0.7 s, 1 s): per MIG layout, alone on the link and at
its fair share, the solo prefill time of a few prompt lengths and the share
of the ShareGPT lengths file's prompts within each figure, with the chunk
the replay would choose, at rho = 0 (the tuner's start) and at the best of
a few static rhos; and, where the slice's HBM holds the model, with every
weight resident as c2cserve now prefills it (dedicated's pass: one
2,048-token chunk at a time, rho 0, the weights read from HBM).

    .venv/bin/python docs/serverless/prefill_vs_paper.py \
        ../shared/traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import pandas as pd

from planner.policies.serverless import choose_chunk, choose_kernel
from planner.profiles import MODEL_PROFILES
from planner.profiles.c2c_cost import GemmTiles, chunk_table, prefill_cost
from planner.profiles.mig import GB, GH200_C2C_LINK, MigSliceProfile, mig_layout

TARGETS_S = (0.15, 0.64, 0.7, 1.0)
RHOS = (0.0, 0.25, 0.5, 0.75, 1.0)


def solo_ttft(prompt: int, mig: MigSliceProfile, share: float, rho: float | None) -> float:
    """Prefill alone on ``mig`` at ``share`` GB/s of C2C: the replay's chunk
    (``choose_chunk`` at a 1 s target); rho None: the best of RHOS."""
    model = MODEL_PROFILES["llama-3-8b"]
    k = choose_kernel(precision="bf16", tokens=4096, mig=mig)
    tiles = GemmTiles(k.sym_block_m, k.block_n, k.asym_block_k)
    bucket = 1 << max(0, math.ceil(math.log2(max(prompt, 1))))
    table = chunk_table(model, mig, prompt_tokens=bucket, c2c_gbps=share, tiles=tiles)
    chunk = choose_chunk(table, ttft_target_s=1.0, mig=mig).chunk_tokens
    rhos = RHOS if rho is None else (rho,)
    return min(
        prefill_cost(
            model,
            prompt_tokens=prompt,
            chunk_tokens=chunk,
            rho=r,
            mig=mig,
            c2c_gbps=share,
            tiles=tiles,
        ).ttft_s
        for r in rhos
    )


STATIC_CHUNK = 2048


def resident_ttft(prompt: int, mig: MigSliceProfile) -> float:
    """Prefill alone on ``mig`` with every weight in its HBM: the static
    chunk, rho 0, the weights read at the slice's HBM rate (as dedicated)."""
    model = MODEL_PROFILES["llama-3-8b"]
    k = choose_kernel(precision="bf16", tokens=4096, mig=mig)
    return prefill_cost(
        model,
        prompt_tokens=prompt,
        chunk_tokens=STATIC_CHUNK,
        rho=0.0,
        mig=mig,
        c2c_gbps=mig.hbm_bytes_per_s / GB,
        tiles=GemmTiles(k.sym_block_m, k.block_n, k.asym_block_k),
    ).ttft_s


LENGTHS = (128, 256, 512, 1024, 1730, 2340, 4096, 8192)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("lengths", help="ShareGPT lengths CSV (num_prefill_tokens column)")
    args = p.parse_args()
    prompts = pd.read_csv(args.lengths)["num_prefill_tokens"].to_numpy()
    values, counts = np.unique(np.maximum(prompts, 1), return_counts=True)
    print(
        f"ShareGPT file: {len(prompts)} prompts, mean {prompts.mean():.0f}, "
        f"p50 {np.median(prompts):.0f}, p95 {np.percentile(prompts, 95):.0f}"
    )
    print(
        "layout | C2C GB/s | rho | "
        + " | ".join(f"{n} tok" for n in LENGTHS)
        + " | "
        + " | ".join(f"within {t:g} s" for t in TARGETS_S)
    )
    for layout in ("1", "3", "7"):
        slices = mig_layout(layout)
        mig = slices[0]
        shares = {("alone", GH200_C2C_LINK.sustained_gbps)}
        shares.add(("fair", GH200_C2C_LINK.sustained_gbps / len(slices)))
        for label, share in sorted(shares, reverse=True):
            for rho in (0.0, None):
                times = [solo_ttft(n, mig, share, rho) for n in LENGTHS]
                ttft = np.array([solo_ttft(int(v), mig, share, rho) for v in values])
                within = [100 * counts[ttft <= t].sum() / counts.sum() for t in TARGETS_S]
                print(
                    f"{len(slices)} x {mig.name} | {label} {share:.0f} | "
                    f"{'0' if rho == 0.0 else 'best'} | "
                    + " | ".join(f"{t:.2f}" for t in times)
                    + " | "
                    + " | ".join(f"{w:.1f}%" for w in within)
                )
        if layout != "7":  # a 12 GB slice cannot hold Llama-3-8B
            times = [resident_ttft(n, mig) for n in LENGTHS]
            ttft = np.array([resident_ttft(int(v), mig) for v in values])
            within = [100 * counts[ttft <= t].sum() / counts.sum() for t in TARGETS_S]
            print(
                f"{len(slices)} x {mig.name} | resident | 0 | "
                + " | ".join(f"{t:.2f}" for t in times)
                + " | "
                + " | ".join(f"{w:.1f}%" for w in within)
            )


if __name__ == "__main__":
    main()
