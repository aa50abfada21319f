"""Inputs and outputs of the buddy-group policy (KunServe, DESIGN.md §3.3).

N serving instances each hold a full replica of the model (P bytes of
parameters over L layers). A buddy group of g instances holds exactly one
replica between them, split into g contiguous layer ranges (pipeline stages),
and so frees (g - 1) * P bytes for KV cache."""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass


class Strategy(enum.StrEnum):
    """How group sizes are chosen."""

    # The paper's Algorithm 1 (the default): merge the two smallest groups
    # until the freed memory covers the demand.
    THROUGHPUT_GREEDY = "throughput-greedy"
    # Merge as much as possible; stop once the added memory exceeds the
    # cluster's original KV region.
    MEMORY_GREEDY = "memory-greedy"
    # The least-cost configuration that covers the demand: a DP over group-size
    # partitions (homogeneous), enumeration of set partitions (heterogeneous).
    EXACT = "exact"


@dataclass(frozen=True, slots=True)
class ThroughputProfile:
    """Thpt_g(g) for g = 1 .. len(group_throughput): group_throughput[g - 1]
    is the throughput of a g-stage pipeline group; group_throughput[0] is one
    instance with the full replica (the paper's Thpt_I). Any unit (tokens/s,
    requests/s); only ratios matter. Groups larger than the profile are not
    formed."""

    group_throughput: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.group_throughput:
            raise ValueError("ThroughputProfile needs Thpt_g(1) at least")
        for i, t in enumerate(self.group_throughput):
            if not (math.isfinite(t) and t > 0):
                raise ValueError(f"Thpt_g({i + 1}) must be finite and > 0, got {t}")

    @property
    def max_group_size(self) -> int:
        return len(self.group_throughput)

    def __call__(self, g: int) -> float:
        return self.group_throughput[g - 1]

    @staticmethod
    def pipeline(
        max_group_size: int, single: float = 1.0, stage_overhead: float = 0.1
    ) -> ThroughputProfile:
        """A simple profile: a g-stage group serves g times one instance's
        throughput, discounted by stage_overhead per extra stage (bubbles and
        activation transfers): Thpt_g(g) = single * g / (1 + stage_overhead *
        (g - 1))."""
        return ThroughputProfile(
            tuple(single * g / (1 + stage_overhead * (g - 1)) for g in range(1, max_group_size + 1))
        )


@dataclass(frozen=True, slots=True)
class Instance:
    """One serving instance as the planner sees it.

    kv_capacity_bytes: its KV region with the full replica resident.
    kv_demand_bytes: KV its running requests use plus what its head-of-line
        queued requests need.
    thpt_scale: its speed relative to the profile (1 for a homogeneous
        cluster); a group runs at its slowest member's speed.
    """

    id: str
    kv_capacity_bytes: int = 0
    kv_demand_bytes: int = 0
    thpt_scale: float = 1.0

    @property
    def pressure_bytes(self) -> int:
        """KV demand beyond its own region (negative: headroom)."""
        return self.kv_demand_bytes - self.kv_capacity_bytes


@dataclass(frozen=True, slots=True)
class ClusterInputs:
    """What one buddy-group decision depends on.

    param_bytes: P, one full replica. num_layers: L (pipeline stages are
    contiguous layer ranges, at least one layer each). required_bytes: R, the
    additional memory needed; None derives it as the sum of the instances'
    positive pressure. heterogeneous: force set-partition enumeration for
    EXACT (automatic when thpt_scale differs between instances).
    """

    instances: tuple[Instance, ...]
    param_bytes: int
    num_layers: int
    profile: ThroughputProfile
    required_bytes: int | None = None
    strategy: Strategy = Strategy.THROUGHPUT_GREEDY
    layer_bytes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.param_bytes < 0:
            raise ValueError(f"param_bytes must be >= 0, got {self.param_bytes}")
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}")
        if self.required_bytes is not None and self.required_bytes < 0:
            raise ValueError(f"required_bytes must be >= 0, got {self.required_bytes}")
        ids = [i.id for i in self.instances]
        if len(set(ids)) != len(ids):
            raise ValueError("instance ids must be unique")
        if self.layer_bytes is not None and (
            len(self.layer_bytes) != self.num_layers or sum(self.layer_bytes) != self.param_bytes
        ):
            raise ValueError("layer_bytes needs num_layers entries summing to param_bytes")

    @property
    def required(self) -> int:
        if self.required_bytes is not None:
            return self.required_bytes
        return sum(max(i.pressure_bytes, 0) for i in self.instances)

    @property
    def max_group_size(self) -> int:
        return max(1, min(self.profile.max_group_size, self.num_layers))

    @property
    def homogeneous(self) -> bool:
        return len({i.thpt_scale for i in self.instances}) <= 1

    def layer_sizes(self) -> tuple[int, ...]:
        """Bytes of each layer: as given, else P spread evenly (the first
        P mod L layers one byte larger), so that they sum to P exactly."""
        if self.layer_bytes is not None:
            return self.layer_bytes
        base, extra = divmod(self.param_bytes, self.num_layers)
        return tuple(base + (1 if i < extra else 0) for i in range(self.num_layers))


@dataclass(frozen=True, slots=True)
class GroupMember:
    """One instance of a group: it keeps layers [first_layer, end_layer)."""

    instance_id: str
    stage: int
    first_layer: int
    end_layer: int
    kept_bytes: int
    freed_bytes: int


@dataclass(frozen=True, slots=True)
class BuddyGroup:
    """Members in pipeline order (stage 0 first); new requests enter at
    stage 0."""

    members: tuple[GroupMember, ...]
    throughput: float

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def freed_bytes(self) -> int:
        return sum(m.freed_bytes for m in self.members)


@dataclass(frozen=True, slots=True)
class BuddyPlan:
    """A buddy configuration with the numbers behind it.

    cost: N * Thpt_g(1) / sum over groups of Thpt_g(|group|) (1 = no loss).
    unmet_bytes: demand the configuration cannot cover (> 0: scale out);
    scale_out_instances: how many more instances would cover it.
    """

    strategy: Strategy
    groups: tuple[BuddyGroup, ...]
    required_bytes: int
    freed_bytes: int
    unmet_bytes: int
    scale_out_instances: int
    cost: float
    throughput: float
    baseline_throughput: float
    merges: int
    summary: str

    def group_sizes(self) -> tuple[int, ...]:
        return tuple(g.size for g in self.groups)

    def member(self, instance_id: str) -> GroupMember | None:
        for g in self.groups:
            for m in g.members:
                if m.instance_id == instance_id:
                    return m
        return None


@dataclass(frozen=True, slots=True)
class LayerChange:
    """What one instance does to move from one plan to the next: layers to
    load back (from a peer or host DRAM) and layers to drop, as [start, end)
    ranges."""

    instance_id: str
    load_ranges: tuple[tuple[int, int], ...]
    drop_ranges: tuple[tuple[int, int], ...]


def ranges_of(layers: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Sorted layer indices as maximal [start, end) runs."""
    out: list[tuple[int, int]] = []
    for layer in sorted(layers):
        if out and out[-1][1] == layer:
            out[-1] = (out[-1][0], layer + 1)
        else:
            out.append((layer, layer + 1))
    return tuple(out)
