"""A fresh placement in two phases (default objective, no model placed):
first the least max |eq| over all placements (placer_patterns.py, proved),
then memory balanced with that cap held (placer_balance.py). G_mem (a GPU's
memory) outweighs the memory imbalance a unit of eq could buy back in any
realistic cluster, and the bound G_mem E* + the memory floor is valid
whatever the placement, so the gap it reports is honest either way."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.domain.placement import PlacementInputs
from planner.policies.aqua.placer_balance import balance_memory, mem_floor_mb
from planner.policies.aqua.placer_counts import deal
from planner.policies.aqua.placer_patterns import min_eq_patterns

MB = 10**6


def _sign(r: int) -> int:
    return (r > 0) - (r < 0)


@dataclass(frozen=True)
class Phased:
    servers: list[int]
    e_star: int  # the proved least max_s |eq_s|


def eq_then_memory(
    inputs: PlacementInputs,
    start: Sequence[int] | None,
    e_low: int,
    eq_deadline: float,
    memory_deadline: float,
) -> Phased | None:
    """The two phases, each to its perf_counter deadline; None when the eq
    phase gives no proved answer in time (the caller keeps its own path)."""
    w = [m.shards * _sign(round(m.r_bytes / MB)) for m in inputs.models]
    if start is not None:
        eq = [0] * inputs.num_servers
        for s, v in zip(start, w, strict=True):
            eq[s] += v
        e_high = max(abs(v) for v in eq)
    else:
        e_high = sum(abs(v) for v in w)
    counts = min_eq_patterns(inputs, e_low, max(e_low, e_high), eq_deadline)
    if counts is None:
        return None
    servers = balance_memory(
        inputs, deal(inputs, counts), counts.e, mem_floor_mb(inputs), memory_deadline
    )
    return Phased(servers, counts.e)
