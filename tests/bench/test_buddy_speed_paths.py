"""The fast paths of planner.policies.buddy.groups (speed work for the
buddy bench) give what the plain ones give: the counts-per-size greedy
against Algorithm 1's heap, the numpy pressure order against the sorted
one (ties, huge byte counts), and the greedy plan against the plan built
from assign_members."""

from __future__ import annotations

import heapq
import random

import pytest

from planner.domain.cluster import ClusterInputs, Instance, ThroughputProfile
from planner.policies.buddy import (
    assign_members,
    groups,
    plan_buddy_groups,
    throughput_greedy_sizes,
)


def heap_greedy(n: int, required: int, param: int, max_group: int) -> tuple[int, ...]:
    """Algorithm 1 literally: pop the two smallest, merge, repeat."""
    if n == 0 or param <= 0:
        return (1,) * n
    heap = [(1, i) for i in range(n)]
    freed = 0
    while len(heap) > 1 and freed < required:
        a, i = heapq.heappop(heap)
        if a + heap[0][0] > max_group:
            heapq.heappush(heap, (a, i))
            break
        b, _ = heapq.heappop(heap)
        heapq.heappush(heap, (a + b, i))
        freed += param
    return tuple(sorted((g for g, _ in heap), reverse=True))


def test_counts_greedy_is_the_heap_greedy() -> None:
    rng = random.Random(1)
    for _ in range(5000):
        n = rng.randrange(0, 80)
        args = (n, rng.randrange(0, 500), rng.choice([0, 1, 5, 10]), rng.randrange(1, 20))
        assert throughput_greedy_sizes(*args) == heap_greedy(*args), args


@pytest.mark.parametrize("scale", [10**9, 4 * 10**18, 10**20])
def test_numpy_order_and_demand(scale: int) -> None:
    rng = random.Random(scale % 97)
    for _ in range(20):
        n = rng.choice([256, 300, 700])
        inst = tuple(
            Instance(
                id=f"{rng.random():.6f}-{i}",
                kv_capacity_bytes=rng.choice([10, 20]) * scale,
                kv_demand_bytes=rng.choice([5, 10, 20, 30]) * scale,
            )
            for i in range(n)
        )
        inputs = ClusterInputs(inst, 3 * 10**9, 32, ThroughputProfile.pipeline(8))
        required, order = groups._demand_and_order(inputs)
        assert required == inputs.required
        assert order == groups._pressure_order(inst)


def test_greedy_plan_matches_the_plain_build() -> None:
    rng = random.Random(5)
    for n in (3, 40, 300):
        inst = tuple(
            Instance(
                id=f"i{rng.randrange(10**6)}-{i}",
                kv_capacity_bytes=10 * 10**9,
                kv_demand_bytes=rng.randrange(1, 25) * 10**9,
            )
            for i in range(n)
        )
        inputs = ClusterInputs(inst, 7 * 10**9, 40, ThroughputProfile.pipeline(6))
        sizes = throughput_greedy_sizes(n, inputs.required, inputs.param_bytes, 6)
        plain = groups._build_plan(inputs, assign_members(sizes, inst), required=inputs.required)
        groups._SINGLETONS.clear()
        assert plan_buddy_groups(inputs) == plain
        assert plan_buddy_groups(inputs) == plain  # warm caches
