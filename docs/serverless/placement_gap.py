"""Greedy vs solver on serverless placement (docs/serverless.md).

    .venv/bin/python docs/serverless/placement_gap.py [--seeds 20] [--time-limit 1.0]

Random long-tail catalogs (model sizes 1-70B bf16, TPOT targets 50-500 ms,
Pareto weights like per-model request rates, KV needs up to 30 GB, HBM
bandwidth needs up to 1.5 TB/s) on three slice layouts; for each instance:
the greedy's served weight and contention against the solver's (CP-SAT,
lexicographic), the solver's status and wall time.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from planner.domain.serverless import MigSlice, PlacementParams, ServerlessModel
from planner.policies.serverless import greedy_assignment, lexicographic_key, plan_placement
from planner.profiles.mig import MIG_PROFILES

P = MIG_PROFILES
LAYOUTS = {
    "7 x 12 GB (identical)": [P["gh200-7x12gb"]] * 7,
    "mixed 2x48 + 2x24 + 3x12": [P["gh200-2x48gb"]]
    + [P["gh200-3x24gb"]] * 2
    + [P["gh200-7x12gb"]] * 3,
}


def catalog(seed: int, n: int) -> list[ServerlessModel]:
    rng = np.random.default_rng(seed)
    sizes_b = np.array([1, 3, 7, 8, 14, 32, 70])
    probs = np.array([0.2, 0.25, 0.2, 0.15, 0.1, 0.07, 0.03])
    return [
        ServerlessModel(
            f"m{i}",
            int(rng.choice(sizes_b, p=probs) * 2e9),
            float(rng.choice([0.05, 0.1, 0.2, 0.5])),
            hbm_bytes=int(rng.uniform(0.5, 30) * 1e9),
            hbm_gbps=float(rng.uniform(20, 1500)),
            weight=float(rng.pareto(1.2) + 0.05),
        )
        for i in range(n)
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--time-limit", type=float, default=1.0)
    args = ap.parse_args()
    print(
        "| layout | models | K | greedy optimal | served-weight gap mean / max | "
        "solver wall p50 / max | statuses |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, layout in LAYOUTS.items():
        slices = [MigSlice(f"s{i}", p) for i, p in enumerate(layout)]
        for n in (20, 87):
            for k in (1, 2):
                params = PlacementParams(
                    link_gbps=405.0,
                    max_models_per_slice=k,
                    method="solver",
                    time_limit_s=args.time_limit,
                )
                optimal = 0
                gaps: list[float] = []
                walls: list[float] = []
                statuses: dict[str, int] = {}
                for seed in range(args.seeds):
                    models = catalog(seed, n)
                    greedy = greedy_assignment(models, slices, params)
                    g = lexicographic_key(models, slices, greedy, params)
                    plan = plan_placement(models, slices, params)
                    where = {a.model: a.slice_id for a in plan.assignments}
                    index = {s.id: i for i, s in enumerate(slices)}
                    chosen = [index[where[m.name]] if m.name in where else -1 for m in models]
                    best = lexicographic_key(models, slices, chosen, params)
                    optimal += g == best
                    gaps.append((best[0] - g[0]) / best[0] if best[0] else 0.0)
                    assert plan.solve is not None
                    walls.append(plan.solve.wall_s)
                    statuses[plan.solve.status] = statuses.get(plan.solve.status, 0) + 1
                st = ", ".join(f"{s} {c}" for s, c in sorted(statuses.items()))
                print(
                    f"| {name} | {n} | {k} | {optimal}/{args.seeds} | "
                    f"{100 * statistics.mean(gaps):.1f}% / {100 * max(gaps):.1f}% | "
                    f"{1e3 * statistics.median(walls):.0f} / {1e3 * max(walls):.0f} ms | {st} |"
                )


if __name__ == "__main__":
    main()
