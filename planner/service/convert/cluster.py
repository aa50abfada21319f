"""ClusterService messages <-> the buddy-group policy's inputs and plans."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from planner.domain.cluster import (
    BuddyGroup,
    BuddyPlan,
    ClusterInputs,
    GroupMember,
    Instance,
    LayerChange,
    Strategy,
    ThroughputProfile,
)
from planner.policies.buddy import (
    MAX_ENUMERATED_INSTANCES,
    RestoreConfig,
    TriggerConfig,
    activation_gap_s,
    exchange_chunk_bytes,
)
from planner.service.convert.checks import finite, non_negative
from planner.service.errors import InvalidArgumentError
from planner.service.limits import MAX_ID_LENGTH, ServiceLimits
from planner.v1 import cluster_pb2

MAX_INSTANCES = 65_536
MAX_LAYERS = 65_536
MAX_BYTES = 1 << 62
# The exact DP grows with instances x group sizes; beyond this, greedy only.
MAX_EXACT_INSTANCES = 1024

STRATEGIES = {
    cluster_pb2.BUDDY_STRATEGY_UNSPECIFIED: Strategy.THROUGHPUT_GREEDY,
    cluster_pb2.BUDDY_STRATEGY_THROUGHPUT_GREEDY: Strategy.THROUGHPUT_GREEDY,
    cluster_pb2.BUDDY_STRATEGY_MEMORY_GREEDY: Strategy.MEMORY_GREEDY,
    cluster_pb2.BUDDY_STRATEGY_EXACT: Strategy.EXACT,
}
_STRATEGY_OUT = {
    Strategy.THROUGHPUT_GREEDY: cluster_pb2.BUDDY_STRATEGY_THROUGHPUT_GREEDY,
    Strategy.MEMORY_GREEDY: cluster_pb2.BUDDY_STRATEGY_MEMORY_GREEDY,
    Strategy.EXACT: cluster_pb2.BUDDY_STRATEGY_EXACT,
}


def byte_count(field: str, value: int) -> int:
    if not 0 <= value <= MAX_BYTES:
        raise InvalidArgumentError(field, f"must be in [0, {MAX_BYTES}], got {value}")
    return value


def cluster_id(field: str, value: str, required: bool = False) -> str:
    if required and not value:
        raise InvalidArgumentError(field, "required (a non-empty string)")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidArgumentError(field, f"longer than {MAX_ID_LENGTH} characters")
    return value


def idempotency_key(value: str) -> str:
    """Optional (empty: none), bounded like an id."""
    if len(value) > MAX_ID_LENGTH:
        raise InvalidArgumentError("idempotency_key", f"longer than {MAX_ID_LENGTH} characters")
    return value


def _instance_ids(ids: Sequence[str], id_name: str, limits: ServiceLimits) -> dict[str, int]:
    """A bounded number of instances, each with an id (the field id_name)
    that is non-empty, short and unique; the index of each id."""
    limit = min(MAX_INSTANCES, limits.max_requests_per_snapshot)
    if len(ids) > limit:
        raise InvalidArgumentError("instances", f"at most {limit} entries, got {len(ids)}")
    seen: dict[str, int] = {}
    for k, value in enumerate(ids):
        path = f"instances[{k}].{id_name}"
        if not value:
            raise InvalidArgumentError(path, "required (a non-empty string)")
        if len(value) > MAX_ID_LENGTH:
            raise InvalidArgumentError(path, f"longer than {MAX_ID_LENGTH} characters")
        if value in seen:
            raise InvalidArgumentError(
                path, f"duplicate instance id {value!r} (also instances[{seen[value]}])"
            )
        seen[value] = k
    return seen


@dataclass(frozen=True, slots=True)
class PlanArgs:
    """A PlanBuddyGroups request, validated."""

    inputs: ClusterInputs
    failed_ids: tuple[str, ...]
    compare_exact: bool
    chunk_bytes: int
    loads: dict[str, int]
    max_batch: dict[str, int]


def plan_request_from_proto(
    msg: cluster_pb2.PlanBuddyGroupsRequest, limits: ServiceLimits
) -> PlanArgs:
    cluster_id("cluster_id", msg.cluster_id)
    if not msg.instances:
        raise InvalidArgumentError("instances", "at least one instance is required")
    seen = _instance_ids([i.id for i in msg.instances], "id", limits)
    instances = []
    loads: dict[str, int] = {}
    max_batch: dict[str, int] = {}
    for k, i in enumerate(msg.instances):
        path = f"instances[{k}]"
        byte_count(f"{path}.kv_capacity_bytes", i.kv_capacity_bytes)
        byte_count(f"{path}.kv_demand_bytes", i.kv_demand_bytes)
        scale = non_negative(f"{path}.throughput_scale", i.throughput_scale) or 1.0
        for name in ("load_requests", "max_batch_requests"):
            if getattr(i, name) < 0:
                raise InvalidArgumentError(
                    f"{path}.{name}", f"must be >= 0, got {getattr(i, name)}"
                )
        if i.max_batch_requests > 0:
            loads[i.id] = i.load_requests
            max_batch[i.id] = i.max_batch_requests
        instances.append(Instance(i.id, i.kv_capacity_bytes, i.kv_demand_bytes, scale))
    if not 1 <= msg.param_bytes <= MAX_BYTES:
        raise InvalidArgumentError(
            "param_bytes", f"must be in [1, {MAX_BYTES}], got {msg.param_bytes}"
        )
    if not 1 <= msg.num_layers <= MAX_LAYERS:
        raise InvalidArgumentError(
            "num_layers", f"must be in [1, {MAX_LAYERS}], got {msg.num_layers}"
        )
    if not msg.group_throughput:
        raise InvalidArgumentError("group_throughput", "required: Thpt_g(1), Thpt_g(2), ...")
    if len(msg.group_throughput) > MAX_INSTANCES:
        raise InvalidArgumentError("group_throughput", f"at most {MAX_INSTANCES} entries")
    for g, t in enumerate(msg.group_throughput):
        finite(f"group_throughput[{g}]", t)
        if t <= 0:
            raise InvalidArgumentError(f"group_throughput[{g}]", f"must be > 0, got {t}")
    required = None
    if msg.HasField("required_bytes"):
        required = byte_count("required_bytes", msg.required_bytes)
    try:
        strategy = STRATEGIES[msg.strategy]
    except KeyError:
        raise InvalidArgumentError("strategy", f"unknown value {msg.strategy}") from None
    failed: dict[str, int] = {}
    for k, f in enumerate(msg.failed_instance_ids):
        path = f"failed_instance_ids[{k}]"
        if f not in seen:
            raise InvalidArgumentError(path, f"{f!r} is not one of the instances")
        if f in failed:
            raise InvalidArgumentError(path, f"duplicate {f!r} (also {failed[f]})")
        failed[f] = k
    if len(failed) == len(instances):
        raise InvalidArgumentError("failed_instance_ids", "every instance failed: nothing to plan")
    inputs = ClusterInputs(
        instances=tuple(instances),
        param_bytes=msg.param_bytes,
        num_layers=msg.num_layers,
        profile=ThroughputProfile(tuple(msg.group_throughput)),
        required_bytes=required,
        strategy=strategy,
    )
    survivors = len(instances) - len(failed)
    heterogeneous = len({i.thpt_scale for i in instances if i.id not in failed}) > 1
    if strategy == Strategy.EXACT or msg.compare_exact:
        field = "strategy" if strategy == Strategy.EXACT else "compare_exact"
        if heterogeneous and survivors > MAX_ENUMERATED_INSTANCES:
            raise InvalidArgumentError(
                field,
                f"exact planning of instances of different throughput_scale enumerates set "
                f"partitions: at most {MAX_ENUMERATED_INSTANCES} instances, got {survivors}",
            )
        if survivors > MAX_EXACT_INSTANCES:
            raise InvalidArgumentError(
                field, f"exact planning takes at most {MAX_EXACT_INSTANCES} instances"
            )
    return PlanArgs(
        inputs=inputs,
        failed_ids=tuple(failed),
        compare_exact=msg.compare_exact,
        chunk_bytes=_chunk_bytes(msg.exchange),
        loads={k: v for k, v in loads.items() if k not in failed},
        max_batch={k: v for k, v in max_batch.items() if k not in failed},
    )


def _chunk_bytes(msg: cluster_pb2.KvExchangeParams) -> int:
    link = non_negative("exchange.link_gbps", msg.link_gbps)
    gap = non_negative("exchange.activation_gap_s", msg.activation_gap_s)
    stage = non_negative("exchange.stage_compute_s", msg.stage_compute_s)
    activation = byte_count("exchange.activation_bytes", msg.activation_bytes)
    align = byte_count("exchange.align_bytes", msg.align_bytes) or 1
    if link == 0:
        return 0
    if gap == 0:
        if stage == 0:
            raise InvalidArgumentError(
                "exchange.activation_gap_s",
                "give the profiled gap, or stage_compute_s (and activation_bytes) to derive it",
            )
        gap = activation_gap_s(stage, activation, link)
    if link * 1e9 * gap > MAX_BYTES:
        raise InvalidArgumentError(
            "exchange",
            f"link_gbps x activation_gap_s is a chunk of more than {MAX_BYTES} bytes "
            f"(link_gbps {link}, gap {gap} s): is the gap in seconds?",
        )
    return exchange_chunk_bytes(link, gap, align)


MAX_HORIZON_S = 86_400.0


def _horizon(value: float) -> float:
    if not non_negative("params.horizon_s", value) <= MAX_HORIZON_S:
        raise InvalidArgumentError(
            "params.horizon_s", f"must be in [0, {MAX_HORIZON_S}] seconds, got {value}"
        )
    return value


def trigger_config_from_proto(msg: cluster_pb2.TriggerParams) -> TriggerConfig:
    d = TriggerConfig()
    horizon = _horizon(msg.horizon_s) if msg.HasField("horizon_s") else d.horizon_s
    w = d.ewma_weight
    if msg.HasField("ewma_weight"):
        w = finite("params.ewma_weight", msg.ewma_weight)
        if not 0 < w <= 1:
            raise InvalidArgumentError("params.ewma_weight", f"must be in (0, 1], got {w}")
    return TriggerConfig(horizon_s=horizon, ewma_weight=w)


def restore_config_from_proto(msg: cluster_pb2.RestoreParams) -> RestoreConfig:
    d = RestoreConfig()
    low = d.low_watermark
    if msg.HasField("low_watermark"):
        low = finite("params.low_watermark", msg.low_watermark)
        if not 0 < low <= 1:
            raise InvalidArgumentError("params.low_watermark", f"must be in (0, 1], got {low}")
    hold = non_negative("params.hold_s", msg.hold_s) if msg.HasField("hold_s") else d.hold_s
    horizon = _horizon(msg.horizon_s) if msg.HasField("horizon_s") else d.horizon_s
    return RestoreConfig(low_watermark=low, hold_s=hold, horizon_s=horizon)


def check_memory_instances(
    msg: cluster_pb2.EvaluateDropTriggerRequest, limits: ServiceLimits
) -> None:
    finite("now_s", msg.now_s)
    _instance_ids([i.instance_id for i in msg.instances], "instance_id", limits)
    for k, i in enumerate(msg.instances):
        path = f"instances[{k}]"
        byte_count(f"{path}.kv_used_bytes", i.kv_used_bytes)
        byte_count(f"{path}.hbm_available_bytes", i.hbm_available_bytes)
        for name in ("kv_rate_bytes_per_s", "hbm_rate_bytes_per_s"):
            if i.HasField(name):
                _rate(f"{path}.{name}", getattr(i, name))


def check_demand_instances(msg: cluster_pb2.DecideRestoreRequest, limits: ServiceLimits) -> None:
    finite("now_s", msg.now_s)
    _instance_ids([i.instance_id for i in msg.instances], "instance_id", limits)
    for k, i in enumerate(msg.instances):
        path = f"instances[{k}]"
        byte_count(f"{path}.kv_demand_bytes", i.kv_demand_bytes)
        byte_count(f"{path}.kv_capacity_bytes", i.kv_capacity_bytes)
        _rate(f"{path}.kv_rate_bytes_per_s", i.kv_rate_bytes_per_s)


def _rate(field: str, value: float) -> float:
    if not abs(finite(field, value)) <= MAX_BYTES:
        raise InvalidArgumentError(field, f"must be in [-{MAX_BYTES}, {MAX_BYTES}], got {value}")
    return value


def plan_to_proto(plan: BuddyPlan) -> cluster_pb2.BuddyPlan:
    return cluster_pb2.BuddyPlan(
        strategy=_STRATEGY_OUT[plan.strategy],
        groups=[
            cluster_pb2.BuddyGroup(
                members=[
                    cluster_pb2.GroupMember(
                        instance_id=m.instance_id,
                        stage=m.stage,
                        first_layer=m.first_layer,
                        end_layer=m.end_layer,
                        kept_bytes=m.kept_bytes,
                        freed_bytes=m.freed_bytes,
                    )
                    for m in g.members
                ],
                throughput=g.throughput,
            )
            for g in plan.groups
        ],
        required_bytes=plan.required_bytes,
        freed_bytes=plan.freed_bytes,
        unmet_bytes=plan.unmet_bytes,
        scale_out_instances=plan.scale_out_instances,
        cost=plan.cost,
        throughput=plan.throughput,
        baseline_throughput=plan.baseline_throughput,
        merges=plan.merges,
        summary=plan.summary,
    )


def plan_from_proto(msg: cluster_pb2.BuddyPlan) -> BuddyPlan:
    """A stored plan back in the domain (the store keeps the proto form)."""
    strategy = STRATEGIES.get(msg.strategy, Strategy.THROUGHPUT_GREEDY)
    return BuddyPlan(
        strategy=strategy,
        groups=tuple(
            BuddyGroup(
                tuple(
                    GroupMember(
                        m.instance_id,
                        m.stage,
                        m.first_layer,
                        m.end_layer,
                        m.kept_bytes,
                        m.freed_bytes,
                    )
                    for m in g.members
                ),
                g.throughput,
            )
            for g in msg.groups
        ),
        required_bytes=msg.required_bytes,
        freed_bytes=msg.freed_bytes,
        unmet_bytes=msg.unmet_bytes,
        scale_out_instances=msg.scale_out_instances,
        cost=msg.cost,
        throughput=msg.throughput,
        baseline_throughput=msg.baseline_throughput,
        merges=msg.merges,
        summary=msg.summary,
    )


def changes_to_proto(changes: tuple[LayerChange, ...]) -> list[cluster_pb2.LayerChange]:
    """Instances with something to load or drop."""
    return [
        cluster_pb2.LayerChange(
            instance_id=c.instance_id,
            load=[cluster_pb2.LayerRange(start=a, end=b) for a, b in c.load_ranges],
            drop=[cluster_pb2.LayerRange(start=a, end=b) for a, b in c.drop_ranges],
        )
        for c in changes
        if c.load_ranges or c.drop_ranges
    ]


def optional_seconds(value: float) -> float | None:
    return value if math.isfinite(value) else None
