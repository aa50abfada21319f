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

import bisect
import functools
import itertools
import math
import operator
import time
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
# Field readers in C (map over them instead of a Python loop per instance).
_ID = operator.attrgetter("id")
_SCALE = operator.attrgetter("thpt_scale")
_DEMAND = operator.attrgetter("kv_demand_bytes")
_LEAD = operator.itemgetter(0)
_CAPACITY = operator.attrgetter("kv_capacity_bytes")


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
    first.

    Every merge frees one replica, so the demand asks for
    merges_needed(required, P) merges. Groups are kept as counts per size and
    the equal smallest ones merge pairwise in one batch: the same merges as a
    heap popping two at a time, in O(distinct sizes) steps."""
    if n == 0 or param_bytes <= 0:
        return (1,) * n
    left = min(merges_needed(required_bytes, param_bytes), n - 1)
    counts: dict[int, int] = {1: n}
    sizes = [1]  # distinct sizes present, ascending
    while left > 0:
        a = sizes[0]
        if counts[a] >= 2:
            if 2 * a > max_group_size:
                break
            m = min(counts[a] // 2, left)
            _take(counts, sizes, a, 2 * m)
            _put(counts, sizes, 2 * a, m)
        else:
            if len(sizes) < 2:
                break
            b = sizes[1]
            if a + b > max_group_size:
                break
            m = 1
            _take(counts, sizes, a, 1)
            _take(counts, sizes, b, 1)
            _put(counts, sizes, a + b, 1)
        left -= m
    out: list[int] = []
    for g in reversed(sizes):
        out.extend([g] * counts[g])
    return tuple(out)


def _take(counts: dict[int, int], sizes: list[int], g: int, k: int) -> None:
    counts[g] -= k
    if counts[g] == 0:
        del counts[g]
        sizes.remove(g)


def _put(counts: dict[int, int], sizes: list[int], g: int, k: int) -> None:
    if g in counts:
        counts[g] += k
    else:
        counts[g] = k
        bisect.insort(sizes, g)


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


# From this many instances numpy's stable argsort beats sorted() with a key.
_NUMPY_ORDER_FROM = 256
_INT62 = 1 << 62


def _demand_and_order(inputs: ClusterInputs) -> tuple[int, list[int]]:
    """inputs.required and _pressure_order(inputs.instances), in one pass."""
    inst = inputs.instances
    n = len(inst)
    given = inputs.required_bytes
    if n >= _NUMPY_ORDER_FROM:
        try:
            demand = np.fromiter(map(_DEMAND, inst), dtype=np.int64, count=n)
            capacity = np.fromiter(map(_CAPACITY, inst), dtype=np.int64, count=n)
        except OverflowError:
            pass  # byte counts beyond int64: the exact Python path
        else:
            # Differences of values below 2**62 fit int64; the demand is
            # summed as Python ints (exact).
            if (
                max(demand.max(), capacity.max()) < _INT62
                and min(demand.min(), capacity.min()) > -_INT62
            ):
                relief = capacity - demand
                required = given if given is not None else -sum(relief[relief < 0].tolist())
                # Stable: ties keep input order, as _pressure_order.
                return required, np.argsort(relief, kind="stable").tolist()
    relief_list = list(map(operator.sub, map(_CAPACITY, inst), map(_DEMAND, inst)))
    required = given if given is not None else -sum(filter((0).__gt__, relief_list))
    return required, sorted(range(n), key=relief_list.__getitem__)


def _pressure_order(instances: Sequence[Instance]) -> list[int]:
    """Most pressure first; ties by input order (a stable sort on the
    negated pressure: no per-item key tuples)."""
    relief = list(map(operator.sub, map(_CAPACITY, instances), map(_DEMAND, instances)))
    return sorted(range(len(instances)), key=relief.__getitem__)


@functools.lru_cache(maxsize=1 << 16)
def _member(fields: tuple[str, int, int, int, int, int]) -> GroupMember:
    """GroupMember(*fields): immutable, shared between plans like
    _singleton's."""
    return GroupMember(*fields)


@functools.lru_cache(maxsize=1 << 16)
def _singleton(instance_id: str, num_layers: int, param_bytes: int, thpt: float) -> BuddyGroup:
    """A lone instance keeping every layer. Plans are recomputed for the
    same cluster again and again and these are immutable, so they are
    shared between plans (most of a large plan's groups are singletons)."""
    return BuddyGroup((GroupMember(instance_id, 0, 0, num_layers, param_bytes, 0),), thpt)


def assign_members(sizes: Sequence[int], instances: Sequence[Instance]) -> list[list[int]]:
    """Instances for each group size: each merged group (largest first) is
    led by one of the most pressured instances and filled with the least
    pressured ones; instances in between stay on their own. Members are in
    pipeline order: the lead first (new requests enter at stage 0), partners
    by rising pressure."""
    merged, singles = _split(sizes, _pressure_order(instances))
    merged.extend([i] for i in singles)
    return merged


def _split(sizes: Sequence[int], order: list[int]) -> tuple[list[list[int]], list[int]]:
    """assign_members on a pressure order: the merged groups, and the
    instances left on their own (a slice of the order, in its order). The
    k merged groups' leads are the first k of the order; each group's
    partners come off the order's end, least pressure first."""
    merged_sizes = [g for g in sizes if g > 1]
    merged_sizes.sort(reverse=True)
    k = len(merged_sizes)
    tail = len(order)
    groups = []
    for lead, g in zip(order, merged_sizes, strict=False):
        # tail - g >= k - 1 >= 0: the slice never wraps around.
        groups.append([lead, *order[tail - 1 : tail - g : -1]])
        tail -= g - 1
    return groups, order[k:tail]


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


def _build_plan(
    inputs: ClusterInputs,
    partition: list[list[int]],
    note: str = "",
    required: int | None = None,
) -> BuddyPlan:
    merged = [b for b in partition if len(b) > 1]
    singles = [b[0] for b in partition if len(b) == 1]
    return _assemble(inputs, merged, singles, note, required)


# Singleton groups shared between plans, per (layers, P, throughput): a
# large plan is mostly singletons, and plans are recomputed for the same
# cluster again and again. Bounded: cleared when it grows past these.
_SINGLETONS: dict[tuple[int, int, float], dict[str, BuddyGroup]] = {}
_MAX_SINGLETON_KEYS = 64
_MAX_SINGLETONS = 1 << 16


def _singletons(ids: list[str], num_layers: int, param_bytes: int, thpt: float) -> list[BuddyGroup]:
    """The singleton groups of these instance ids (all of speed thpt), in
    the ids' order."""
    key = (num_layers, param_bytes, thpt)
    cache = _SINGLETONS.get(key)
    if cache is None:
        if len(_SINGLETONS) >= _MAX_SINGLETON_KEYS:
            _SINGLETONS.clear()
        cache = _SINGLETONS[key] = {}
    missing = set(ids).difference(cache)
    if missing:
        if len(cache) + len(missing) > _MAX_SINGLETONS:
            cache.clear()
            missing = set(ids)
        for i in missing:
            cache[i] = BuddyGroup((GroupMember(i, 0, 0, num_layers, param_bytes, 0),), thpt)
    return list(map(cache.__getitem__, ids))


def _assemble(
    inputs: ClusterInputs,
    merged: list[list[int]],
    singles: list[int],
    note: str = "",
    required: int | None = None,
) -> BuddyPlan:
    inst = inputs.instances
    p = inputs.param_bytes
    layers = inputs.num_layers
    t1 = inputs.profile(1)
    total = 0.0
    ids = list(map(_ID, inst))
    scales = list(map(_SCALE, inst))
    uniform = not scales or (
        scales.count(scales[0]) == len(scales) and scales[0] == scales[0]  # no NaN
    )
    # Instances are usually given in id order: then index order is id order
    # (timsort checks that in one linear pass) and sorts can use the indices.
    ids_sorted = sorted(ids) == ids
    groups = []
    if merged:
        prefix = [0, *itertools.accumulate(inputs.layer_sizes())]
        # The total sums in the partition's order (the rounding of the
        # plan's numbers does not depend on the speed work below).
        if uniform:
            size_thpt = {g: inputs.profile(g) for g in set(map(len, merged))}
            thpts = [size_thpt[len(b)] * scales[b[0]] for b in merged]
        else:
            thpts = [_group_throughput([inst[i] for i in b], inputs.profile) for b in merged]
        for thpt in thpts:
            total += thpt
        # Largest first, then by the lead's id (the plan's group order).
        ranked = sorted(
            (-len(b), b[0] if ids_sorted else ids[b[0]], k) for k, b in enumerate(merged)
        )
        merged = [merged[k] for *_, k in ranked]
        thpts = [thpts[k] for *_, k in ranked]
        # Per group size: each stage's (stage, first, end, kept, freed), and Thpt_g.
        templates: dict[int, list[tuple[int, int, int, int, int]]] = {}
        for size in set(map(len, merged)):
            templates[size] = [
                (stage, first, end, prefix[end] - prefix[first], p - prefix[end] + prefix[first])
                for stage, (first, end) in enumerate(stage_layer_ranges(layers, size))
            ]
        # Pipeline order within a group: pressure first (assign_members'
        # order for the greedy; re-sorted for enumerated partitions).
        members = list(
            map(
                _member,
                [
                    (ids[i], *t)
                    for block in merged
                    for i, t in zip(block, templates[len(block)], strict=True)
                ],
            )
        )
        at = 0
        for block, thpt in zip(merged, thpts, strict=True):
            size = len(block)
            groups.append(BuddyGroup(tuple(members[at : at + size]), thpt))
            at += size
    # Singletons keep every layer; listed by id.
    if uniform and singles:
        thpt = t1 * scales[singles[0]]
        for _ in singles:  # one addition each, as the general path (same rounding)
            total += thpt
        if ids_sorted:
            single_ids = list(map(ids.__getitem__, sorted(singles)))
        else:
            single_ids = sorted(map(ids.__getitem__, singles))
        groups.extend(_singletons(single_ids, layers, p, thpt))
    else:
        for i in sorted(singles, key=ids.__getitem__):
            thpt = t1 * scales[i]
            total += thpt
            groups.append(_singleton(ids[i], layers, p, thpt))
    freed = (len(inst) - len(groups)) * p
    n = len(inst)
    if required is None:
        required = inputs.required
    unmet = max(required - freed, 0)
    baseline = t1 * sum(scales)
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
        # One pass over the instances for both the demand and the order.
        required, pressure_order = _demand_and_order(inputs)
        sizes = throughput_greedy_sizes(n, required, p, g_max)
        merged, singles = _split(sizes, pressure_order)
        return _assemble(inputs, merged, singles, required=required)
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
