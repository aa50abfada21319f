"""A fresh placement in phases (default objective, no model placed): first
the least max |eq| over all placements (placer_patterns.py, proved), then
memory balanced with that cap held (placer_balance.py), then, while time is
left, CP-SAT on the memory windows (placer_window.py): a better placement or
a proof that raises the memory floor. G_mem (a GPU's memory) outweighs the
memory imbalance a unit of eq could buy back in any realistic cluster, and
the bound reported (`phased_bound_mb`) is valid whatever the placement, so
the gap it reports is honest either way."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from planner.domain.placement import PlacementInputs
from planner.policies.aqua.placer_balance import balance_memory, mem_floor_mb
from planner.policies.aqua.placer_counts import deal
from planner.policies.aqua.placer_patterns import min_eq_patterns
from planner.policies.aqua.placer_window import max_abs_mem_mb, prove_memory

MB = 10**6
# The window proof runs only where its model (models x servers binaries)
# can be handed to CP-SAT in this much time per variable and the time left
# covers it several times over (measured: ~30 us per variable).
WINDOW_SETUP_S_PER_VAR = 30e-6
WINDOW_SETUP_MARGIN = 4.0


def _sign(r: int) -> int:
    return (r > 0) - (r < 0)


@dataclass(frozen=True)
class Phased:
    servers: list[int]
    e_star: int  # the proved least max_s |eq_s|
    # A proved lower bound on max_s |mem_s| (MB) over placements with
    # max |eq| <= e_star: the mean floor, raised by window proofs.
    mem_floor_mb: int
    # The proof's thresholds (T in MB, the solver's answer), in order.
    thresholds: tuple[tuple[int, str], ...] = ()


def phased_bound_mb(inputs: PlacementInputs, phased: Phased) -> int:
    """A lower bound on the default objective (MB) over all placements: one
    with max |eq| = E* has max |mem| >= the proved floor under that cap; one
    with a larger max |eq| pays G_mem more and has at least the mean floor."""
    g_mem = round(inputs.gpu_memory_bytes / MB)
    return min(
        phased.mem_floor_mb + g_mem * phased.e_star,
        mem_floor_mb(inputs) + g_mem * (phased.e_star + 1),
    )


def eq_then_memory(
    inputs: PlacementInputs,
    start: Sequence[int] | None,
    e_low: int,
    *,
    eq_deadline: float,
    memory_deadline: float,
    proof_deadline: float | None = None,
) -> Phased | None:
    """The phases, each to its perf_counter deadline (no window proof when
    `proof_deadline` is None or its model is too large for the time left);
    None when the eq phase gives no proved answer in time (the caller keeps
    its own path)."""
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
    floor = mem_floor_mb(inputs)
    servers = balance_memory(inputs, deal(inputs, counts), counts.e, floor, memory_deadline)
    if proof_deadline is None or max_abs_mem_mb(inputs, servers) <= floor:
        return Phased(servers, counts.e, floor)
    setup_s = WINDOW_SETUP_S_PER_VAR * len(inputs.models) * inputs.num_servers
    if proof_deadline - time.perf_counter() < WINDOW_SETUP_MARGIN * setup_s:
        return Phased(servers, counts.e, floor)
    proof = prove_memory(inputs, servers, counts.e, floor, proof_deadline)
    return Phased(proof.servers, counts.e, proof.floor_mb, proof.thresholds)
