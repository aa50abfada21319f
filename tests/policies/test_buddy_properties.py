"""Invariants of buddy-group plans over random clusters and profiles
(DESIGN.md §3.3): every group holds exactly one full replica in contiguous
layer ranges, freed bytes = sum (g - 1) * P, every instance is placed once,
greedy never beats exact, and a failure re-plan restores the invariant."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from planner.domain.cluster import BuddyPlan, ClusterInputs, Instance, Strategy, ThroughputProfile
from planner.policies.buddy import (
    exact_partition,
    exact_sizes,
    plan_buddy_groups,
    plan_transition,
    replan_after_failure,
    restore_groups,
    throughput_greedy_sizes,
)
from planner.policies.buddy.groups import _set_partitions

SETTINGS = settings(max_examples=50, deadline=None)


@st.composite
def profiles(draw, max_size: int = 10) -> ThroughputProfile:
    """Thpt_g(1) = 1 and any positive Thpt_g(g) (pipelines are usually below
    g, but nothing here relies on it)."""
    g_max = draw(st.integers(1, max_size))
    rest = draw(
        st.lists(st.floats(0.1, 12.0, allow_nan=False), min_size=g_max - 1, max_size=g_max - 1)
    )
    return ThroughputProfile((1.0, *rest))


@st.composite
def clusters(draw, max_n: int = 12, heterogeneous: bool = False) -> ClusterInputs:
    n = draw(st.integers(1, max_n))
    scales = (
        draw(st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=n, max_size=n))
        if heterogeneous
        else [1.0] * n
    )
    inst = tuple(
        Instance(
            f"i{j}",
            kv_capacity_bytes=draw(st.integers(0, 100)),
            kv_demand_bytes=draw(st.integers(0, 200)),
            thpt_scale=scales[j],
        )
        for j in range(n)
    )
    p = draw(st.integers(1, 60))
    layers = draw(st.integers(1, 16))
    required = draw(st.one_of(st.none(), st.integers(0, 20 * p)))
    strategy = draw(st.sampled_from(list(Strategy)))
    return ClusterInputs(inst, p, layers, draw(profiles()), required, strategy)


def assert_valid(plan: BuddyPlan, inputs: ClusterInputs) -> None:
    p, layers = inputs.param_bytes, inputs.num_layers
    placed = [m.instance_id for g in plan.groups for m in g.members]
    assert sorted(placed) == sorted(i.id for i in inputs.instances)
    for g in plan.groups:
        assert 1 <= g.size <= inputs.max_group_size
        # One full replica: contiguous, ordered, non-empty ranges covering [0, L).
        start = 0
        for stage, m in enumerate(g.members):
            assert m.stage == stage
            assert m.first_layer == start < m.end_layer
            start = m.end_layer
            assert m.kept_bytes + m.freed_bytes == p
        assert start == layers
        assert sum(m.kept_bytes for m in g.members) == p
        assert g.freed_bytes == (g.size - 1) * p
    assert plan.freed_bytes == sum((g.size - 1) * p for g in plan.groups)
    assert plan.freed_bytes == plan.merges * p
    assert plan.unmet_bytes == max(plan.required_bytes - plan.freed_bytes, 0)
    assert (plan.scale_out_instances > 0) == (plan.unmet_bytes > 0)
    assert plan.cost > 0


@SETTINGS
@given(clusters())
def test_plans_hold_one_replica_per_group(inputs):
    plan = plan_buddy_groups(inputs)
    assert_valid(plan, inputs)
    if inputs.strategy == Strategy.THROUGHPUT_GREEDY and plan.unmet_bytes == 0:
        # Algorithm 1 stops as soon as the demand is met: one merge fewer
        # would not cover it.
        assert plan.freed_bytes - inputs.param_bytes < max(plan.required_bytes, 1)


@SETTINGS
@given(clusters(max_n=7, heterogeneous=True))
def test_heterogeneous_plans_hold_one_replica_per_group(inputs):
    assert_valid(plan_buddy_groups(inputs), inputs)


def _with(inputs: ClusterInputs, strategy: Strategy) -> ClusterInputs:
    return ClusterInputs(
        inputs.instances,
        inputs.param_bytes,
        inputs.num_layers,
        inputs.profile,
        inputs.required_bytes,
        strategy,
    )


@SETTINGS
@given(clusters(max_n=8), st.booleans())
def test_greedy_never_beats_exact(inputs, heterogeneous_method):
    greedy = plan_buddy_groups(_with(inputs, Strategy.THROUGHPUT_GREEDY))
    exact = plan_buddy_groups(_with(inputs, Strategy.EXACT))
    assert exact.unmet_bytes <= greedy.unmet_bytes
    if greedy.unmet_bytes == 0:
        assert exact.cost <= greedy.cost * (1 + 1e-9)
    if heterogeneous_method:
        # Enumerating set partitions finds the same optimum as the size DP.
        blocks = exact_partition(_with(inputs, Strategy.EXACT))
        total = sum(inputs.profile(len(b)) for b in blocks)
        assert total == pytest.approx(exact.throughput)


@SETTINGS
@given(clusters(max_n=7, heterogeneous=True))
def test_greedy_never_beats_heterogeneous_exact(inputs):
    greedy = plan_buddy_groups(_with(inputs, Strategy.THROUGHPUT_GREEDY))
    exact = plan_buddy_groups(_with(inputs, Strategy.EXACT))
    assert exact.unmet_bytes <= greedy.unmet_bytes
    if greedy.unmet_bytes == 0:
        assert exact.throughput >= greedy.throughput * (1 - 1e-9)


def _integer_partitions(n: int, largest: int):
    if n == 0:
        yield ()
        return
    for g in range(min(n, largest), 0, -1):
        for rest in _integer_partitions(n - g, g):
            yield (g, *rest)


@SETTINGS
@given(
    st.integers(1, 14),
    st.integers(0, 14),
    profiles(max_size=14),
    st.integers(1, 14),
)
def test_exact_dp_matches_brute_force(n, merges, profile, layers):
    g_max = min(profile.max_group_size, layers)
    best = None
    for sizes in _integer_partitions(n, g_max):
        covered = n - len(sizes) >= merges
        key = (0, -sum(profile(g) for g in sizes)) if covered else (1, len(sizes))
        if best is None or key < best:
            best = key
    sizes = exact_sizes(n, merges * 10, 10, profile, layers)
    assert sum(sizes) == n and max(sizes) <= g_max
    covered = n - len(sizes) >= merges
    assert covered == (best[0] == 0)
    if covered:
        assert -sum(profile(g) for g in sizes) == pytest.approx(best[1])
    else:
        assert len(sizes) == best[1]


@SETTINGS
@given(clusters(), st.data())
def test_failure_replan_restores_the_invariant(inputs, data):
    assume(len(inputs.instances) >= 2)
    before = plan_buddy_groups(inputs)
    ids = [i.id for i in inputs.instances]
    failed = data.draw(
        st.lists(st.sampled_from(ids), min_size=1, max_size=len(ids) - 1, unique=True)
    )
    after = replan_after_failure(inputs, failed)
    survivors = ClusterInputs(
        tuple(i for i in inputs.instances if i.id not in failed),
        inputs.param_bytes,
        inputs.num_layers,
        inputs.profile,
        inputs.required_bytes,
        inputs.strategy,
    )
    assert_valid(after, survivors)
    # Applying the transition to what each survivor held gives its new range.
    for c in plan_transition(before, after, inputs.num_layers):
        old = before.member(c.instance_id)
        new = after.member(c.instance_id)
        assert old is not None and new is not None
        held = set(range(old.first_layer, old.end_layer))
        held |= {x for a, b in c.load_ranges for x in range(a, b)}
        held -= {x for a, b in c.drop_ranges for x in range(a, b)}
        assert held == set(range(new.first_layer, new.end_layer))


@SETTINGS
@given(clusters(), st.data())
def test_restore_keeps_every_group_a_full_replica(inputs, data):
    plan = plan_buddy_groups(inputs)
    chosen = data.draw(st.lists(st.integers(0, len(plan.groups) - 1), unique=True))
    restored = restore_groups(plan, chosen)
    assert restored.freed_bytes == sum(
        g.freed_bytes for i, g in enumerate(plan.groups) if i not in chosen
    )
    for g in restored.groups:
        assert sum(m.kept_bytes for m in g.members) == inputs.param_bytes
        assert [m.end_layer - m.first_layer for m in g.members][-1] > 0
    assert sorted(m.instance_id for g in restored.groups for m in g.members) == sorted(
        i.id for i in inputs.instances
    )


@SETTINGS
@given(st.integers(1, 64), st.integers(0, 80), st.integers(1, 64))
def test_greedy_merges_exactly_what_the_demand_needs(n, merges, g_max):
    sizes = throughput_greedy_sizes(n, merges * 7, 7, g_max)
    done = n - len(sizes)
    assert sum(sizes) == n and max(sizes) <= g_max
    assert done <= merges
    if done < merges:
        # Stopped early only because nothing more can merge.
        assert len(sizes) == 1 or sorted(sizes)[0] + sorted(sizes)[1] > g_max
    # Merging the two smallest keeps every size within twice the smallest.
    assert max(sizes) <= 2 * min(sizes)


def test_partition_enumeration_counts_bell_numbers():
    bell = [1, 1, 2, 5, 15, 52, 203, 877]
    for n in range(1, 8):
        assert sum(1 for _ in _set_partitions(n, n)) == bell[n]
    # Blocks of at most 2 of 4 items: 10 (involutions of 4).
    assert sum(1 for _ in _set_partitions(4, 2)) == 10
    # Each partition listed once.
    seen = {tuple(sorted(tuple(b) for b in blocks)) for blocks in _set_partitions(5, 5)}
    assert len(seen) == 52
    assert all(len(list(itertools.chain(*p))) == 5 for p in seen)
