"""Synthetic traces: arrivals from a rate schedule and a burstiness, lengths
from a length model; deterministic for a seed.

The seed feeds a numpy SeedSequence split in two independent streams, one
for the arrivals and one for the lengths, so changing the rate or the
duration does not change the sequence of lengths (only how many are used).
Arrival times are rounded to the microsecond.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.trace.arrivals import RateSchedule, arrival_times
from planner.trace.errors import SpecError
from planner.trace.length_model import LengthModel
from planner.trace.records import TraceRequest


@dataclass(frozen=True, slots=True)
class GenConfig:
    schedule: RateSchedule
    lengths: LengthModel
    burstiness: float = 1.0  # CV of the gaps; 1 is Poisson
    seed: int = 0
    duration_s: float | None = None
    num_requests: int | None = None


def check_seed(seed: int) -> int:
    if seed < 0:
        raise SpecError("--seed", f"must be an integer >= 0, got {seed}")
    return seed


def seeded_streams(seed: int) -> tuple[np.random.Generator, np.random.Generator]:
    """(arrivals, lengths) generators of a seed."""
    arrivals_seq, lengths_seq = np.random.SeedSequence(check_seed(seed)).spawn(2)
    return np.random.default_rng(arrivals_seq), np.random.default_rng(lengths_seq)


def generate(config: GenConfig) -> list[TraceRequest]:
    arrivals_rng, lengths_rng = seeded_streams(config.seed)
    times = arrival_times(
        config.schedule,
        config.burstiness,
        arrivals_rng,
        duration_s=config.duration_s,
        num_requests=config.num_requests,
    )
    if len(times) == 0:
        raise SpecError("--duration", "no arrival falls within the duration; raise the rate")
    prompts, outputs = config.lengths.sample(lengths_rng, len(times))
    return [
        TraceRequest(arrival_s=round(float(t), 6), prompt_tokens=int(p), output_tokens=int(o))
        for t, p, o in zip(times, prompts, outputs, strict=True)
    ]
