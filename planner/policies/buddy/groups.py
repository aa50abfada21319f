"""Buddy-group configurations (KunServe §4.1, DESIGN.md §3.3).

A configuration partitions the N instances into groups; a group of g holds one
replica split into g contiguous layer ranges and frees (g - 1) * P bytes, so
a configuration with m groups frees (N - m) * P: every merge of two groups
frees exactly one replica. Cost (throughput loss, minimized) =
sum of the instances' own throughput / sum over groups of Thpt_g(|group|),
which for a homogeneous cluster is N * Thpt_g(1) / sum Thpt_g(|group|).

Sizes first, then members: the strategies choose group sizes (for a
homogeneous cluster only sizes matter), then `assign_members` puts the
instances under the most memory pressure with the ones that have the most
headroom. The exact strategy on a heterogeneous cluster (instances of
different speeds; a group runs at its slowest member's) enumerates set
partitions instead.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import deque
from collections.abc import Iterator, Sequence

import numpy as np

from planner.domain.cluster import (
    BuddyGroup,
    BuddyPlan,
    ClusterInputs,
    GroupMember,
    Instance,
    LayerChange,
    Strategy,
    ThroughputProfile,
    ranges_of,
)

# Set-partition enumeration (Bell(10) = 115,975 partitions) is the exact
# method for heterogeneous clusters; larger ones are refused.
MAX_ENUMERATED_INSTANCES = 10
_REL_TOL = 1e-12


def freed_bytes(sizes: Sequence[int], param_bytes: int) -> int:
    """sum over groups of (g - 1) * P."""
    return sum(g - 1 for g in sizes) * param_bytes


def merges_needed(required_bytes: int, param_bytes: int) -> int:
    """Merges (replicas to drop) for the freed memory to cover the demand."""
    if required_bytes <= 0:
        return 0
    if param_bytes <= 0:
        return 1 << 62  # nothing frees memory: never enough
    return -(-required_bytes // param_bytes)


def configuration_cost(sizes: Sequence[int], profile: ThroughputProfile) -> float:
    """N * Thpt_g(1) / sum Thpt_g(g): 1 with no groups, above 1 with
    pipeline losses."""
    n = sum(sizes)
    return n * profile(1) / sum(profile(g) for g in sizes)


def throughput_greedy_sizes(
    n: int, required_bytes: int, param_bytes: int, max_group_size: int
) -> tuple[int, ...]:
    """Algorithm 1: from singletons, merge the two smallest groups while more
    than one group is left and the freed memory is below the demand. A merge
    that would exceed max_group_size is not made (the two smallest cannot
    merge, so no two can): the demand is then left unmet. Sizes largest
    first."""
    if n == 0 or param_bytes <= 0:
        return (1,) * n
    heap = [(1, i) for i in range(n)]
    freed = 0
    while len(heap) > 1 and freed < required_bytes:
        a, i = heapq.heappop(heap)
        b = heap[0][0]
        if a + b > max_group_size:
            heapq.heappush(heap, (a, i))
            break
        heapq.heappop(heap)
        heapq.heappush(heap, (a + b, i))
        freed += param_bytes
    return tuple(sorted((g for g, _ in heap), reverse=True))


def memory_greedy_sizes(
    n: int, kv_region_bytes: int, param_bytes: int, max_group_size: int
) -> tuple[int, ...]:
    """Merge as much as possible (two smallest first, as Algorithm 1), and
    stop once the added memory exceeds the original KV region: the check is
    Algorithm 1's with the KV region in place of R, so the last merge is the
    one that crosses it."""
    return throughput_greedy_sizes(n, kv_region_bytes + 1, param_bytes, max_group_size)


def exact_sizes(
    n: int,
    required_bytes: int,
    param_bytes: int,
    profile: ThroughputProfile,
    max_group_size: int,
    *,
    time_limit_s: float | None = None,
) -> tuple[int, ...]:
    """The least-cost group sizes whose freed memory covers the demand, by a
    DP over partitions of n into m parts of at most max_group_size:
    best[m][k] = max over g of best[m-1][k-g] + Thpt_g(g). Configurations
    with m <= n - merges_needed groups cover the demand; among them the one
    with the highest total throughput wins (ties: fewer merges). When no
    configuration covers it, the one that frees the most (fewest groups).
    Raises TimeoutError past time_limit_s (wall clock, like a solver's)."""
    if n == 0:
        return ()
    started = time.perf_counter()
    g_max = max(1, min(max_group_size, profile.max_group_size, n))
    m_lo = -(-n // g_max)
    m_hi = n if param_bytes <= 0 else n - min(merges_needed(required_bytes, param_bytes), n)
    m_hi = max(m_hi, m_lo)
    thpt = np.array([profile(g) for g in range(1, g_max + 1)])
    # shift[g-1, k] reads best[k - g]: one gather per m over every g at once.
    ks = np.arange(n + 1)
    src = ks[None, :] - np.arange(1, g_max + 1)[:, None]
    valid = src >= 0
    src = np.where(valid, src, 0)
    best = np.full(n + 1, -np.inf)
    best[0] = 0.0
    choices = np.zeros((m_hi + 1, n + 1), dtype=np.int32)
    totals = np.full(m_hi + 1, -np.inf)
    for m in range(1, m_hi + 1):
        cand = np.where(valid, best[src], -np.inf) + thpt[:, None]
        arg = np.argmax(cand, axis=0)  # first max: the smallest g on ties
        best = cand[arg, ks]
        choices[m] = arg + 1
        totals[m] = best[n]
        if time_limit_s is not None and time.perf_counter() - started > time_limit_s:
            raise TimeoutError(f"exact DP over {n} instances ran past {time_limit_s} s")
    # Highest throughput; ties go to more groups (fewer merges).
    m_best = m_lo
    for m in range(m_lo, m_hi + 1):
        if totals[m] >= totals[m_best] * (1 - _REL_TOL) - _REL_TOL:
            m_best = m
    sizes = []
    k = n
    for m in range(m_best, 0, -1):
        g = int(choices[m][k])
        sizes.append(g)
        k -= g
    assert k == 0
    return tuple(sorted(sizes, reverse=True))


def _set_partitions(n: int, max_block: int) -> Iterator[list[list[int]]]:
    """Every partition of range(n) into blocks of at most max_block, each
    once (restricted growth order)."""
    blocks: list[list[int]] = []

    def place(i: int) -> Iterator[list[list[int]]]:
        if i == n:
            yield blocks
            return
        for b in blocks:
            if len(b) < max_block:
                b.append(i)
                yield from place(i + 1)
                b.pop()
        blocks.append([i])
        yield from place(i + 1)
        blocks.pop()

    yield from place(0)


def _group_throughput(members: Sequence[Instance], profile: ThroughputProfile) -> float:
    return profile(len(members)) * min(m.thpt_scale for m in members)


def exact_partition(inputs: ClusterInputs) -> list[list[int]]:
    """Heterogeneous exact: enumerate set partitions, keep the least-cost one
    that covers the demand (ties: fewer merges, then enumeration order); when
    none does, the one that frees the most, then least cost."""
    inst = inputs.instances
    n = len(inst)
    if n > MAX_ENUMERATED_INSTANCES:
        raise ValueError(
            f"exact planning of instances with different speeds enumerates set partitions: "
            f"at most {MAX_ENUMERATED_INSTANCES} instances, got {n}"
        )
    required = inputs.required
    best_key: tuple[float, ...] | None = None
    best: list[list[int]] = [[i] for i in range(n)]
    for blocks in _set_partitions(n, inputs.max_group_size):
        merges = n - len(blocks)
        freed = merges * inputs.param_bytes
        total = sum(_group_throughput([inst[i] for i in b], inputs.profile) for b in blocks)
        covered = freed >= required
        key = (0.0, -total, merges) if covered else (1.0, -freed, -total)
        if best_key is None or _less(key, best_key):
            best_key = key
            best = [list(b) for b in blocks]
    return best


def _less(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    for x, y in zip(a, b, strict=True):
        if math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-12):
            continue
        return x < y
    return False


def _pressure_order(instances: Sequence[Instance]) -> list[int]:
    """Most pressure first; ties by input order."""
    return sorted(range(len(instances)), key=lambda i: (-instances[i].pressure_bytes, i))


def assign_members(sizes: Sequence[int], instances: Sequence[Instance]) -> list[list[int]]:
    """Instances for each group size: each merged group (largest first) is
    led by one of the most pressured instances and filled with the least
    pressured ones; instances in between stay on their own. Members are in
    pipeline order: the lead first (new requests enter at stage 0), partners
    by rising pressure."""
    order = deque(_pressure_order(instances))
    merged = sorted((g for g in sizes if g > 1), reverse=True)
    groups: list[list[int]] = [[order.popleft()] for _ in merged]
    for group, g in zip(groups, merged, strict=True):
        group.extend(order.pop() for _ in range(g - 1))
    groups.extend([i] for i in order)
    return groups


def stage_layer_ranges(num_layers: int, stages: int) -> tuple[tuple[int, int], ...]:
    """Contiguous [start, end) layer ranges, as even as possible (the first
    num_layers mod stages stages one layer longer)."""
    base, extra = divmod(num_layers, stages)
    out = []
    start = 0
    for s in range(stages):
        end = start + base + (1 if s < extra else 0)
        out.append((start, end))
        start = end
    return tuple(out)


def _build_plan(inputs: ClusterInputs, partition: list[list[int]], note: str = "") -> BuddyPlan:
    inst = inputs.instances
    p = inputs.param_bytes
    layers = inputs.num_layers
    t1 = inputs.profile(1)
    merged = []
    singles = []
    total = 0.0
    for block in partition:
        if len(block) == 1:
            singles.append(block[0])
        else:
            merged.append(block)
    prefix = [0, *itertools.accumulate(inputs.layer_sizes())] if merged else [0]
    ranges: dict[int, tuple[tuple[int, int], ...]] = {}
    groups = []
    for block in merged:
        # Pipeline order within a group: pressure first (assign_members'
        # order for the greedy; re-sorted for enumerated partitions).
        size = len(block)
        if size not in ranges:
            ranges[size] = stage_layer_ranges(layers, size)
        members = []
        for stage, ((first, end), i) in enumerate(zip(ranges[size], block, strict=True)):
            kept = prefix[end] - prefix[first]
            members.append(GroupMember(inst[i].id, stage, first, end, kept, p - kept))
        thpt = _group_throughput([inst[i] for i in block], inputs.profile)
        total += thpt
        groups.append(BuddyGroup(tuple(members), thpt))
    groups.sort(key=lambda g: (-g.size, g.members[0].instance_id))
    # Singletons keep every layer; listed by id.
    for i in sorted(singles, key=lambda i: inst[i].id):
        thpt = t1 * inst[i].thpt_scale
        total += thpt
        groups.append(BuddyGroup((GroupMember(inst[i].id, 0, 0, layers, p, 0),), thpt))
    freed = (len(inst) - len(groups)) * p
    n = len(inst)
    required = inputs.required
    unmet = max(required - freed, 0)
    baseline = t1 * sum(i.thpt_scale for i in inst)
    cost = baseline / total if total > 0 else 1.0
    scale_out = 0
    if unmet > 0:
        caps = [i.kv_capacity_bytes for i in inst if i.kv_capacity_bytes > 0]
        gain = (sum(caps) / len(caps)) if caps else p
        scale_out = max(1, math.ceil(unmet / gain)) if gain > 0 else 1
    sizes = ", ".join(str(len(g.members)) for g in groups[: len(merged)]) or "none"
    summary = (
        f"{inputs.strategy.value}: {n} instances, merged groups of {sizes}; "
        f"freed {freed} of {required} bytes required, cost {cost:.4f}"
    )
    if unmet:
        summary += f"; {unmet} bytes unmet: scale out by {scale_out}"
    if note:
        summary += f" ({note})"
    return BuddyPlan(
        strategy=inputs.strategy,
        groups=tuple(groups),
        required_bytes=required,
        freed_bytes=freed,
        unmet_bytes=unmet,
        scale_out_instances=scale_out,
        cost=cost,
        throughput=total,
        baseline_throughput=baseline,
        merges=n - len(groups),
        summary=summary,
    )


def plan_buddy_groups(inputs: ClusterInputs, time_limit_s: float | None = None) -> BuddyPlan:
    """The buddy configuration of inputs.strategy, with the members' layer
    ranges and the bytes each frees. An exact DP that runs past time_limit_s
    falls back to the throughput-greedy plan and says so in the summary."""
    n = len(inputs.instances)
    g_max = inputs.max_group_size
    p = inputs.param_bytes
    if inputs.strategy == Strategy.EXACT and not inputs.homogeneous:
        partition = exact_partition(inputs)
        order = {i: rank for rank, i in enumerate(_pressure_order(inputs.instances))}
        for block in partition:
            block.sort(key=order.__getitem__)
        return _build_plan(inputs, partition, "set partitions enumerated")
    if inputs.strategy == Strategy.EXACT:
        try:
            sizes = exact_sizes(
                n, inputs.required, p, inputs.profile, g_max, time_limit_s=time_limit_s
            )
        except TimeoutError:
            sizes = throughput_greedy_sizes(n, inputs.required, p, g_max)
            members = assign_members(sizes, inputs.instances)
            return _build_plan(inputs, members, "exact DP out of time: throughput-greedy plan")
    elif inputs.strategy == Strategy.MEMORY_GREEDY:
        region = sum(i.kv_capacity_bytes for i in inputs.instances)
        sizes = memory_greedy_sizes(n, region, p, g_max)
    else:
        sizes = throughput_greedy_sizes(n, inputs.required, p, g_max)
    return _build_plan(inputs, assign_members(sizes, inputs.instances))


def replan_after_failure(
    inputs: ClusterInputs, failed_ids: Sequence[str], time_limit_s: float | None = None
) -> BuddyPlan:
    """A global re-plan over the surviving instances (KunServe §4.3, "Fault
    tolerance"): the groups of a failed instance lost part of their replica,
    so every survivor is planned again; layers a survivor lacks for its new
    range come back from host DRAM (see plan_transition)."""
    failed = set(failed_ids)
    unknown = failed - {i.id for i in inputs.instances}
    if unknown:
        raise ValueError(f"unknown failed instances: {sorted(unknown)}")
    survivors = tuple(i for i in inputs.instances if i.id not in failed)
    return plan_buddy_groups(
        ClusterInputs(
            instances=survivors,
            param_bytes=inputs.param_bytes,
            num_layers=inputs.num_layers,
            profile=inputs.profile,
            required_bytes=inputs.required_bytes,
            strategy=inputs.strategy,
            layer_bytes=inputs.layer_bytes,
        ),
        time_limit_s,
    )


def restore_groups(plan: BuddyPlan, group_indices: Sequence[int]) -> BuddyPlan:
    """The plan with the given groups split back into full replicas (each
    member a singleton keeping every layer). Throughput numbers are those of
    the plan with the restored groups at Thpt_g(1) per member, scaled from
    the group's own per-member figure (exact for homogeneous clusters)."""
    chosen = set(group_indices)
    groups: list[BuddyGroup] = []
    num_layers = max((m.end_layer for g in plan.groups for m in g.members), default=0)
    for idx, g in enumerate(plan.groups):
        if idx not in chosen or g.size == 1:
            groups.append(g)
            continue
        param = sum(m.kept_bytes for m in g.members)
        single = plan.baseline_throughput / max(sum(x.size for x in plan.groups), 1)
        groups.extend(
            BuddyGroup((GroupMember(m.instance_id, 0, 0, num_layers, param, 0),), single)
            for m in g.members
        )
    groups.sort(key=lambda g: (-g.size, g.members[0].instance_id))
    freed = sum(g.freed_bytes for g in groups)
    total = sum(g.throughput for g in groups)
    unmet = max(plan.required_bytes - freed, 0)
    return BuddyPlan(
        strategy=plan.strategy,
        groups=tuple(groups),
        required_bytes=plan.required_bytes,
        freed_bytes=freed,
        unmet_bytes=unmet,
        scale_out_instances=plan.scale_out_instances if unmet else 0,
        cost=plan.baseline_throughput / total if total > 0 else 1.0,
        throughput=total,
        baseline_throughput=plan.baseline_throughput,
        merges=sum(g.size - 1 for g in groups),
        summary=f"restored {len(chosen)} group(s); " + plan.summary,
    )


def plan_transition(
    old: BuddyPlan | None, new: BuddyPlan, num_layers: int
) -> tuple[LayerChange, ...]:
    """Per instance of the new plan: layers to load and layers to drop to
    move from the old plan (an instance absent from it holds every layer)."""
    out = []
    for g in new.groups:
        for m in g.members:
            before = old.member(m.instance_id) if old is not None else None
            had = (
                set(range(before.first_layer, before.end_layer))
                if before is not None
                else set(range(num_layers))
            )
            keep = set(range(m.first_layer, m.end_layer))
            out.append(LayerChange(m.instance_id, ranges_of(keep - had), ranges_of(had - keep)))
    return tuple(out)
