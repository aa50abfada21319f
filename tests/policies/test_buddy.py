"""Buddy groups (KunServe, DESIGN.md §3.3): the paper's numbers, exact small
plans of each strategy, member choice by pressure, layer ranges, failure
re-plans and restores."""

from __future__ import annotations

import math

import pytest

from planner.domain.cluster import ClusterInputs, Instance, Strategy, ThroughputProfile
from planner.policies.buddy import (
    assign_members,
    configuration_cost,
    exact_partition,
    exact_sizes,
    exchange_time_s,
    freed_bytes,
    memory_greedy_sizes,
    plan_buddy_groups,
    plan_transition,
    replan_after_failure,
    restore_groups,
    stage_layer_ranges,
    throughput_greedy_sizes,
)
from planner.profiles import MODEL_PROFILES

GB = 10**9
P = 28 * GB  # Qwen-2.5-14B in bf16, the paper's Table 1
# A profile with the diminishing returns the paper describes (§4.1).
PROFILE = ThroughputProfile((1.0, 1.8, 2.5, 3.1, 3.6, 4.0, 4.3, 4.5))


def instances(n: int, demand_gb: list[int] | None = None, cap_gb: int = 40) -> tuple[Instance, ...]:
    demand = demand_gb or [cap_gb] * n
    return tuple(Instance(f"i{j}", cap_gb * GB, demand[j] * GB) for j in range(n))


def inputs(n: int = 8, **kw) -> ClusterInputs:
    base = {"instances": instances(n), "param_bytes": P, "num_layers": 48, "profile": PROFILE}
    base.update(kw)
    return ClusterInputs(**base)


# --- the paper's arithmetic ---------------------------------------------------


def test_eight_instances_four_groups_free_four_replicas_one_group_frees_seven():
    """§4.1: 8 instances in 4 groups free 4x the parameter size; all 8 in one
    group free 7x, only 1.75x more."""
    four = throughput_greedy_sizes(8, 4 * P, P, 8)
    assert four == (2, 2, 2, 2)
    assert freed_bytes(four, P) == 4 * P
    one = throughput_greedy_sizes(8, 7 * P, P, 8)
    assert one == (8,)
    assert freed_bytes(one, P) == 7 * P
    assert freed_bytes(one, P) / freed_bytes(four, P) == 1.75


def test_qwen_14b_kv_and_exchange_numbers():
    """§2.2 and §4.2: 192 KB of KV per token, 64 K tokens take 12 GB, 1 K
    tokens 192 MB; a blocking exchange of 33 GB over 200 Gbps takes ~1.3 s."""
    qwen = MODEL_PROFILES["qwen2.5-14b"]
    assert qwen.kv_bytes_per_token() == 192 * 1024
    assert 1024 * qwen.kv_bytes_per_token() == 192 * 1024**2
    assert 64 * 1024 * qwen.kv_bytes_per_token() == 12 * 1024**3
    assert exchange_time_s(33 * GB, 200 / 8) == pytest.approx(1.32)
    assert round(exchange_time_s(33 * GB, 200 / 8), 1) == 1.3


def test_algorithm_1_merges_two_smallest_until_demand_met():
    # 3 merges: 1+1, 1+1, 1+1 -> three pairs and two singletons.
    assert throughput_greedy_sizes(8, 3 * P, P, 8) == (2, 2, 2, 1, 1)
    # Demand one byte above 4 replicas: a 5th merge, of the two smallest (2+2).
    assert throughput_greedy_sizes(8, 4 * P + 1, P, 8) == (4, 2, 2)
    # No demand: singletons.
    assert throughput_greedy_sizes(8, 0, P, 8) == (1,) * 8
    # Unreachable demand: merges until one group is left.
    assert throughput_greedy_sizes(8, 100 * P, P, 8) == (8,)
    # A profile (or the layer count) caps the group size.
    assert throughput_greedy_sizes(8, 100 * P, P, 2) == (2, 2, 2, 2)


def test_greedy_reports_unmet_demand_as_scale_out():
    plan = plan_buddy_groups(inputs(4, required_bytes=10 * P))
    assert plan.group_sizes() == (4,)
    assert plan.freed_bytes == 3 * P
    assert plan.unmet_bytes == 7 * P
    # Each new instance brings its 40 GB KV region: 196 GB / 40 GB -> 5.
    assert plan.scale_out_instances == math.ceil(7 * P / (40 * GB)) == 5
    assert "scale out by 5" in plan.summary


def test_memory_greedy_stops_once_added_memory_exceeds_the_kv_region():
    # KV region 8 x 40 GB = 320 GB; each merge frees 28 GB: 12 merges would be
    # needed to exceed it, 7 are possible -> one group.
    assert memory_greedy_sizes(8, 320 * GB, P, 8) == (8,)
    # Region 60 GB: merges while freed <= 60 GB -> 3 merges (84 GB).
    assert memory_greedy_sizes(8, 60 * GB, P, 8) == (2, 2, 2, 1, 1)
    plan = plan_buddy_groups(inputs(8, strategy=Strategy.MEMORY_GREEDY))
    assert plan.group_sizes() == (8,)


def test_exact_beats_greedy_where_balanced_groups_are_better():
    # 5 merges of 8: greedy makes (4, 2, 2); (3, 3, 2) has more throughput.
    assert throughput_greedy_sizes(8, 5 * P, P, 8) == (4, 2, 2)
    assert exact_sizes(8, 5 * P, P, PROFILE, 8) == (3, 3, 2)
    assert configuration_cost((3, 3, 2), PROFILE) == pytest.approx(8 / 6.8)
    assert configuration_cost((4, 2, 2), PROFILE) == pytest.approx(8 / 6.7)
    greedy = plan_buddy_groups(inputs(8, required_bytes=5 * P))
    exact = plan_buddy_groups(inputs(8, required_bytes=5 * P, strategy=Strategy.EXACT))
    assert exact.cost < greedy.cost
    assert exact.freed_bytes == greedy.freed_bytes == 5 * P


def test_exact_may_merge_more_when_the_profile_rewards_it():
    superlinear = ThroughputProfile((1.0, 2.5, 3.0))
    # No demand at all, yet pairs beat singletons under this profile.
    assert exact_sizes(4, 0, P, superlinear, 3) == (2, 2)


def test_exact_with_unreachable_demand_frees_the_most():
    assert exact_sizes(6, 100 * P, P, PROFILE, 3) == (3, 3)


def test_exact_dp_out_of_time_falls_back_to_greedy_and_says_so():
    plan = plan_buddy_groups(inputs(8, required_bytes=5 * P, strategy=Strategy.EXACT), 0.0)
    assert plan.group_sizes() == (4, 2, 2)
    assert "out of time" in plan.summary


def test_heterogeneous_exact_puts_slow_instances_together():
    fast, slow = 1.0, 0.5
    inst = (
        Instance("f0", thpt_scale=fast),
        Instance("s0", thpt_scale=slow),
        Instance("f1", thpt_scale=fast),
        Instance("s1", thpt_scale=slow),
    )
    plan = plan_buddy_groups(
        ClusterInputs(inst, P, 48, PROFILE, required_bytes=2 * P, strategy=Strategy.EXACT)
    )
    groups = sorted(sorted(m.instance_id for m in g.members) for g in plan.groups)
    assert groups == [["f0", "f1"], ["s0", "s1"]]
    assert plan.throughput == pytest.approx(1.8 * fast + 1.8 * slow)
    assert plan.baseline_throughput == pytest.approx(3.0)


def test_heterogeneous_exact_refuses_large_clusters():
    inst = tuple(Instance(f"i{j}", thpt_scale=1 + j) for j in range(11))
    with pytest.raises(ValueError, match="at most 10"):
        exact_partition(ClusterInputs(inst, P, 48, PROFILE, strategy=Strategy.EXACT))


# --- members, layers, bytes --------------------------------------------------


def test_pressured_instances_merge_with_the_least_pressured():
    demand = [70, 20, 55, 35, 10, 45, 60, 30]  # GB, capacity 40 each
    inst = instances(8, demand)
    plan = plan_buddy_groups(inputs(8, instances=inst))
    # R = 30 + 15 + 5 + 20 = 70 GB -> 3 merges of 28 GB.
    assert plan.required_bytes == 70 * GB
    assert plan.group_sizes() == (2, 2, 2, 1, 1)
    pairs = [[m.instance_id for m in g.members] for g in plan.groups if g.size == 2]
    # Leads by pressure (i0 70, i6 60, i2 55), partners from the least (i4 10,
    # i1 20, i7 30); i5 (45) and i3 (35) stay on their own.
    assert pairs == [["i0", "i4"], ["i2", "i7"], ["i6", "i1"]]
    singles = sorted(g.members[0].instance_id for g in plan.groups if g.size == 1)
    assert singles == ["i3", "i5"]


def test_assign_members_orders_stages_lead_first():
    inst = instances(4, [90, 10, 50, 30])
    assert assign_members((4,), inst) == [[0, 1, 3, 2]]
    assert assign_members((2, 1, 1), inst) == [[0, 1], [2], [3]]


def test_layer_ranges_and_bytes_of_a_three_stage_group():
    assert stage_layer_ranges(10, 3) == ((0, 4), (4, 7), (7, 10))
    plan = plan_buddy_groups(
        ClusterInputs(instances(3), 1000, 10, PROFILE, required_bytes=2 * 1000)
    )
    (group,) = plan.groups
    assert [(m.first_layer, m.end_layer) for m in group.members] == [(0, 4), (4, 7), (7, 10)]
    assert [m.kept_bytes for m in group.members] == [400, 300, 300]
    assert [m.freed_bytes for m in group.members] == [600, 700, 700]
    assert plan.freed_bytes == 2 * 1000


def test_given_layer_bytes_are_respected():
    layer_bytes = (500, 100, 100, 300)  # embeddings-heavy first layer
    plan = plan_buddy_groups(
        ClusterInputs(instances(2), 1000, 4, PROFILE, required_bytes=1, layer_bytes=layer_bytes)
    )
    assert [m.kept_bytes for m in plan.groups[0].members] == [600, 400]
    assert plan.freed_bytes == 1000


def test_groups_never_exceed_the_layer_count():
    plan = plan_buddy_groups(inputs(8, num_layers=3, required_bytes=100 * P))
    assert max(plan.group_sizes()) <= 3
    assert plan.unmet_bytes > 0


# --- failure, restore, transitions --------------------------------------------


def test_failure_replan_gives_every_group_a_full_replica_again():
    base = inputs(8, required_bytes=4 * P)
    before = plan_buddy_groups(base)
    failed = before.groups[0].members[1].instance_id
    partner = before.groups[0].members[0].instance_id
    after = replan_after_failure(base, [failed])
    assert before.member(failed) is not None and after.member(failed) is None
    assert sum(after.group_sizes()) == 7
    for g in after.groups:
        assert [(m.first_layer, m.end_layer) for m in g.members] == list(
            stage_layer_ranges(48, g.size)
        )
    # Demand still met with 7 instances: 4 merges.
    assert after.freed_bytes == 4 * P
    changes = {c.instance_id: c for c in plan_transition(before, after, 48)}
    # The survivor of the broken pair loads back what it had dropped.
    old = before.member(partner)
    new = after.member(partner)
    assert old is not None and new is not None
    had = set(range(old.first_layer, old.end_layer))
    need = set(range(new.first_layer, new.end_layer))
    loaded = {x for a, b in changes[partner].load_ranges for x in range(a, b)}
    assert loaded == need - had


def test_failure_of_unknown_instance_is_refused():
    with pytest.raises(ValueError, match="unknown failed"):
        replan_after_failure(inputs(4), ["nope"])


def test_restore_splits_groups_back_into_full_replicas():
    plan = plan_buddy_groups(inputs(8, required_bytes=4 * P))
    restored = restore_groups(plan, [0])
    assert restored.group_sizes() == (2, 2, 2, 1, 1)
    assert restored.freed_bytes == 3 * P
    assert restored.unmet_bytes == P
    changes = plan_transition(plan, restored, 48)
    loads = {c.instance_id: c.load_ranges for c in changes if c.load_ranges}
    members = [m.instance_id for m in plan.groups[0].members]
    assert set(loads) == set(members)
    assert loads[members[0]] == ((24, 48),) and loads[members[1]] == ((0, 24),)


def test_transition_from_full_replicas_drops_only():
    plan = plan_buddy_groups(inputs(4, required_bytes=P))
    changes = [c for c in plan_transition(None, plan, 48) if c.drop_ranges or c.load_ranges]
    assert [c.drop_ranges for c in changes] == [((24, 48),), ((0, 24),)]
    assert all(not c.load_ranges for c in changes)


def test_profile_validation():
    with pytest.raises(ValueError):
        ThroughputProfile(())
    with pytest.raises(ValueError):
        ThroughputProfile((1.0, 0.0))
    assert ThroughputProfile.pipeline(3, 2.0, 0.0).group_throughput == (2.0, 4.0, 6.0)
