"""A closed loop for checking the knob tuner: one slice runs the same pass
(a prefill chunk or a decode step) every interval, timed by the C2C cost
model, while co-tenants' streaming takes part of the shared link; the tuner
sees the latency and both utilizations and moves rho at every boundary.
Deterministic for a seed (optional multiplicative noise)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from planner.policies.serverless.tuner import KnobObservation, RhoTuner, TunerParams
from planner.profiles.c2c_cost import model_pass_cost
from planner.profiles.mig import GB, MigSliceProfile
from planner.profiles.models import ModelProfile


@dataclass(frozen=True, slots=True)
class LoopTrace:
    time_s: np.ndarray
    rho: np.ndarray
    latency_s: np.ndarray
    c2c_util: np.ndarray
    hbm_util: np.ndarray
    cotenant_gbps: np.ndarray
    # The best static rho (grid 0.01) and its latency at each interval's load.
    best_rho: np.ndarray
    best_latency_s: np.ndarray


def plant(
    model: ModelProfile,
    tokens: int,
    rho: float,
    *,
    mig: MigSliceProfile,
    link_gbps: float,
    cotenant_gbps: float,
) -> tuple[float, float, float]:
    """(latency, u_c2c, u_hbm) of one pass at this rho and co-tenant load."""
    free = max(link_gbps - cotenant_gbps, 1e-3)
    cost = model_pass_cost(model, tokens, rho=rho, mig=mig, c2c_gbps=free, overhead_s=0.0)
    t = cost.time_s
    own = cost.c2c_bytes / t / GB
    u_c2c = min(1.0, (own + cotenant_gbps) / link_gbps)
    u_hbm = min(1.0, cost.hbm_bytes / t / mig.hbm_bytes_per_s)
    return t, u_c2c, u_hbm


def run_loop(
    model: ModelProfile,
    tokens: int,
    *,
    mig: MigSliceProfile,
    link_gbps: float,
    cotenant_gbps: Callable[[int], float],
    intervals: int,
    latency_budget_s: float,
    params: TunerParams | None = None,
    interval_s: float = 0.01,
    noise: float = 0.0,
    seed: int = 0,
) -> LoopTrace:
    """Run the loop for ``intervals`` control intervals; ``cotenant_gbps(i)``
    is the co-tenants' link use during interval i."""
    rng = np.random.default_rng(seed)
    tuner = RhoTuner(params)
    grid = np.linspace(0.0, 1.0, 101)
    cols: dict[str, list[float]] = {
        k: [] for k in ("t", "rho", "lat", "c2c", "hbm", "co", "best", "best_lat")
    }
    cache: dict[float, tuple[float, float]] = {}
    for i in range(intervals):
        load = cotenant_gbps(i)
        rho = tuner.state.rho
        lat, u_c2c, u_hbm = plant(
            model, tokens, rho, mig=mig, link_gbps=link_gbps, cotenant_gbps=load
        )
        if noise > 0:
            lat *= float(rng.lognormal(0.0, noise))
            u_c2c = min(1.0, u_c2c * float(rng.lognormal(0.0, noise)))
            u_hbm = min(1.0, u_hbm * float(rng.lognormal(0.0, noise)))
        if load not in cache:
            times = [
                plant(model, tokens, float(r), mig=mig, link_gbps=link_gbps, cotenant_gbps=load)[0]
                for r in grid
            ]
            j = int(np.argmin(times))
            cache[load] = (float(grid[j]), float(times[j]))
        cols["t"].append(i * interval_s)
        cols["rho"].append(rho)
        cols["lat"].append(lat)
        cols["c2c"].append(u_c2c)
        cols["hbm"].append(u_hbm)
        cols["co"].append(load)
        cols["best"].append(cache[load][0])
        cols["best_lat"].append(cache[load][1])
        tuner.observe(
            KnobObservation(
                now_s=i * interval_s,
                latency_s=lat,
                latency_budget_s=latency_budget_s,
                hbm_util=u_hbm,
                c2c_util=u_c2c,
                at_boundary=True,
            )
        )
    return LoopTrace(
        time_s=np.array(cols["t"]),
        rho=np.array(cols["rho"]),
        latency_s=np.array(cols["lat"]),
        c2c_util=np.array(cols["c2c"]),
        hbm_util=np.array(cols["hbm"]),
        cotenant_gbps=np.array(cols["co"]),
        best_rho=np.array(cols["best"]),
        best_latency_s=np.array(cols["best_lat"]),
    )
