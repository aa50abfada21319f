"""The rho tuner after a step change in co-tenant link load (docs/serverless.md).

    .venv/bin/python docs/serverless/knob_plot.py [--out docs/serverless/knob_convergence.png]

One 3 x 24 GB slice prefills 2048-token chunks of Llama-3-8B with every
weight streamed over C2C (405 GB/s usable); at interval 100 co-tenants
start streaming 250 GB/s. Top: rho against the cost model's best static rho
at each load; middle: latency against the budget and the best static
latency; bottom: the smoothed-signal inputs u_c2c and u_hbm. A second run
adds 3 % lognormal noise to every measurement.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from planner.policies.serverless.knob_sim import run_loop
from planner.profiles import MODEL_PROFILES
from planner.profiles.mig import GH200_C2C_LINK, MIG_PROFILES

STEP_AT = 100
BUDGET_S = 0.6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).with_name("knob_convergence.png")))
    args = ap.parse_args()
    kw = {
        "mig": MIG_PROFILES["gh200-3x24gb"],
        "link_gbps": GH200_C2C_LINK.sustained_gbps,
        "cotenant_gbps": lambda i: 0.0 if i < STEP_AT else 250.0,
        "intervals": 250,
        "latency_budget_s": BUDGET_S,
    }
    model = MODEL_PROFILES["llama-3-8b"]
    clean = run_loop(model, 2048, **kw)
    noisy = run_loop(model, 2048, noise=0.03, seed=1, **kw)
    fig, ax = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    x = range(len(clean.rho))
    ax[0].plot(x, clean.rho, label="rho (tuner)")
    ax[0].plot(x, noisy.rho, alpha=0.6, label="rho (tuner, 3% noise)")
    ax[0].plot(x, clean.best_rho, "k--", label="best static rho")
    ax[0].set_ylabel("rho")
    ax[0].legend(loc="upper right")
    ax[1].plot(x, clean.latency_s, label="latency")
    ax[1].plot(x, clean.best_latency_s, "k--", label="best static")
    ax[1].axhline(BUDGET_S, color="r", linestyle=":", label="budget")
    ax[1].set_ylabel("chunk latency (s)")
    ax[1].legend(loc="upper right")
    ax[2].plot(x, clean.c2c_util, label="u_c2c")
    ax[2].plot(x, clean.hbm_util, label="u_hbm")
    ax[2].set_ylabel("utilization")
    ax[2].set_xlabel(f"control interval (co-tenants start 250 GB/s at {STEP_AT})")
    ax[2].legend(loc="lower right")
    for a in ax:
        a.axvline(STEP_AT, color="grey", linewidth=0.5)
    fig.suptitle("HybridGEMM rho tuner: Llama-3-8B prefill on a 3 x 24 GB GH200 slice")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    after = clean.rho[-60:]
    print(
        f"wrote {args.out}; settled rho {after.mean():.3f} (band {after.max() - after.min():.3f}),"
        f" best static {clean.best_rho[-1]:.2f}; latency {clean.latency_s[-1]:.3f} s"
        f" vs best {clean.best_latency_s[-1]:.3f} s, budget {BUDGET_S} s"
    )


if __name__ == "__main__":
    main()
