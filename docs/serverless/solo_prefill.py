"""How many requests of a trace cannot meet a TTFT target even alone on one
MIG slice (docs/serverless.md, "The claims"): each prompt is prefilled with
the chunk the replay would choose (``choose_chunk`` on the cost model's
table, the link's fair share), the kernel family's tiles, rho = 0.

    .venv/bin/python docs/serverless/solo_prefill.py /tmp/sl/ali3k.jsonl --mig 3 --ttft 1
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from planner.policies.serverless import choose_chunk, choose_kernel
from planner.profiles import MODEL_PROFILES
from planner.profiles.c2c_cost import GemmTiles, chunk_table, prefill_cost
from planner.profiles.mig import GH200_C2C_LINK, mig_layout
from planner.trace.io import load_trace


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--mig", default="3")
    p.add_argument("--ttft", type=float, default=1.0)
    p.add_argument("--model", default="llama-3-8b")
    args = p.parse_args()
    model = MODEL_PROFILES[args.model]
    slices = mig_layout(args.mig)
    mig = slices[0]
    share = GH200_C2C_LINK.sustained_gbps / len(slices)
    k = choose_kernel(precision="bf16", tokens=4096, mig=mig)
    tiles = GemmTiles(k.sym_block_m, k.block_n, k.asym_block_k)
    chunks: dict[int, int] = {}
    times = []
    for t in load_trace(args.trace):
        bucket = 1 << max(0, math.ceil(math.log2(max(t.prompt_tokens, 1))))
        if bucket not in chunks:
            table = chunk_table(model, mig, prompt_tokens=bucket, c2c_gbps=share, tiles=tiles)
            chunks[bucket] = choose_chunk(table, ttft_target_s=args.ttft, mig=mig).chunk_tokens
        row = prefill_cost(
            model,
            prompt_tokens=max(1, t.prompt_tokens),
            chunk_tokens=chunks[bucket],
            rho=0.0,
            mig=mig,
            c2c_gbps=share,
            tiles=tiles,
        )
        times.append(row.ttft_s)
    ttft = np.array(times)
    print(
        f"{len(ttft)} requests on {mig.name} ({share:.0f} GB/s of C2C): prefill alone p50 "
        f"{np.median(ttft):.3f} s, p95 {np.percentile(ttft, 95):.3f} s; "
        f"over {args.ttft:g} s: {100 * (ttft > args.ttft).mean():.1f}%"
    )


if __name__ == "__main__":
    main()
