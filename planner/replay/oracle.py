"""The replay simulator as a load -> (TTFT, TBT, memory) oracle (AQUA roles,
DESIGN.md §3.4, when no measured curve is given).

:func:`evaluate` runs the rotation-topology replay (``Engine`` with the
``fcfs`` scheduler, one deployment built by :func:`build_setup` from a
``MODEL@HARDWARE`` profile name) on a Poisson arrival stream at ``rate_rps``
for ``duration_s`` simulated seconds of arrivals, then lets the engine drain
for at most ``drain_limit_s`` more. Request lengths come from the
``sharegpt`` preset of the trace generator, or, when ``requests`` is given,
are drawn (seeded, with replacement) from those requests' prompt and output
lengths: the caller reads a trace file, the oracle does no I/O.

It returns TTFT attainment (fraction of requests with TTFT <= the SLO; one
without a first token misses), token-level TBT attainment (fraction of token
gaps <= the SLO), their p99s and the peak and mean GPU KV memory in bytes
(per GPU; blocks used x block bytes, the mean over iterations). Pure: the
same inputs (seed included) give the same :class:`LoadPoint`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from planner.domain.requests import Slo
from planner.replay.engine import Engine
from planner.replay.metrics import summarize
from planner.replay.scheduler_by_name import make_scheduler
from planner.replay.setup import ReplayKnobs, ReplaySetup, build_setup
from planner.trace.arrivals import RateSchedule
from planner.trace.generate import GenConfig, generate
from planner.trace.length_model import preset_or_dist
from planner.trace.records import TraceRequest

DEFAULT_DURATION_S = 20.0
DEFAULT_DRAIN_LIMIT_S = 20.0


@dataclass(frozen=True, slots=True)
class LoadPoint:
    rate_rps: float
    requests: int
    ttft_attainment: float
    tbt_attainment: float
    ttft_p99_s: float
    tbt_p99_s: float
    peak_kv_bytes: int
    mean_kv_bytes: int
    # Per GPU: the weights and the HBM, for free = hbm - weights - KV.
    weight_bytes: int
    hbm_bytes: int

    def meets(self, attainment: float) -> bool:
        """Both TTFT and TBT attainment >= attainment."""
        return self.ttft_attainment >= attainment and self.tbt_attainment >= attainment


def workload(
    rate_rps: float,
    duration_s: float,
    seed: int,
    requests: Sequence[TraceRequest] | None = None,
    lengths: str = "sharegpt",
) -> list[TraceRequest]:
    """Poisson arrivals at rate_rps for duration_s, lengths from the preset or
    resampled from `requests`."""
    trace = generate(
        GenConfig(
            schedule=RateSchedule.constant(rate_rps),
            lengths=preset_or_dist(lengths),
            duration_s=duration_s,
            seed=seed,
        )
    )
    if requests:
        rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(3)[2])
        picks = rng.integers(0, len(requests), size=len(trace))
        trace = [
            replace(
                t,
                prompt_tokens=requests[i].prompt_tokens,
                output_tokens=requests[i].output_tokens,
            )
            for t, i in zip(trace, picks.tolist(), strict=True)
        ]
    return trace


def evaluate(
    profile: str | ReplaySetup,
    rate_rps: float,
    slo: Slo,
    *,
    duration_s: float = DEFAULT_DURATION_S,
    drain_limit_s: float = DEFAULT_DRAIN_LIMIT_S,
    seed: int = 0,
    requests: Sequence[TraceRequest] | None = None,
    lengths: str = "sharegpt",
) -> LoadPoint:
    """One replay run at rate_rps; see the module docstring. Raises
    ProfileError for a bad profile name and ValueError for a bad rate or
    duration."""
    if not rate_rps > 0:
        raise ValueError(f"rate_rps: must be > 0, got {rate_rps}")
    if not duration_s > 0:
        raise ValueError(f"duration_s: must be > 0, got {duration_s}")
    setup = build_setup(profile, ReplayKnobs(slo=slo)) if isinstance(profile, str) else profile
    config = replace(setup.engine, slo=slo, drain_limit_s=drain_limit_s)
    trace = workload(rate_rps, duration_s, seed, requests, lengths)
    engine = Engine(config, make_scheduler("fcfs", setup.rotation), setup.cost, setup.link, trace)
    result = engine.run()
    m = summarize(result)
    used = [s.gpu_kv_blocks_used for s in result.timeline]
    mean_blocks = float(np.mean(used)) if used else 0.0
    return LoadPoint(
        rate_rps=rate_rps,
        requests=m.requests,
        ttft_attainment=m.ttft_attainment if m.ttft_attainment is not None else 1.0,
        tbt_attainment=m.tbt_attainment if m.tbt_attainment is not None else 1.0,
        ttft_p99_s=m.ttft_s.p99 if m.ttft_s.p99 is not None else float("inf"),
        tbt_p99_s=m.tbt_s.p99 if m.tbt_s.p99 is not None else 0.0,
        peak_kv_bytes=m.peak_gpu_kv_blocks * config.block_bytes,
        mean_kv_bytes=round(mean_blocks * config.block_bytes),
        weight_bytes=setup.cost.weight_bytes_per_gpu(),
        hbm_bytes=setup.hardware.hbm_bytes,
    )
