"""ClusterService handlers (buddy groups, DESIGN.md §3.3). Each cluster's
state lives in the durable ClusterStore as one JSON document:

    {"num_layers": L, "plan": <BuddyPlan, proto JSON> | null,
     "monitors": {instance_id: InstanceMonitor.to_dict()},
     "restore": {group key: RestoreMonitor.to_dict()}}

A handler reads and writes it in one transaction, so an answered call's
change survives a crash of the server. A call with an idempotency key and a
cluster_id is answered once (ClusterStore.answer): its retries get the
recorded answer with replayed = true."""

from __future__ import annotations

import time
from typing import Any

from google.protobuf import json_format

from planner.domain.cluster import BuddyPlan, ClusterInputs, Strategy
from planner.policies.buddy import (
    InstanceMonitor,
    RestoreMonitor,
    plan_buddy_groups,
    plan_transition,
    rebalance,
    replan_after_failure,
    restore_groups,
)
from planner.service.cluster_store import ClusterStore
from planner.service.convert.cluster import (
    MAX_BYTES,
    changes_to_proto,
    check_demand_instances,
    check_memory_instances,
    cluster_id,
    idempotency_key,
    optional_seconds,
    plan_from_proto,
    plan_request_from_proto,
    plan_to_proto,
    restore_config_from_proto,
    trigger_config_from_proto,
)
from planner.service.errors import InvalidArgumentError
from planner.service.idempotency import KeyedCall
from planner.service.limits import ServiceLimits
from planner.v1 import cluster_pb2

# Left of the caller's deadline for storing the plan and answering.
DEADLINE_MARGIN_S = 0.005


def _plan_json(plan: BuddyPlan) -> dict[str, Any]:
    return json_format.MessageToDict(plan_to_proto(plan), preserving_proto_field_name=True)


def _stored_plan(state: dict[str, Any] | None) -> BuddyPlan | None:
    if not state or not state.get("plan"):
        return None
    msg = json_format.ParseDict(state["plan"], cluster_pb2.BuddyPlan())
    return plan_from_proto(msg)


def _empty_state(num_layers: int) -> dict[str, Any]:
    return {"num_layers": num_layers, "plan": None, "monitors": {}, "restore": {}}


def _group_key(ids: list[str]) -> str:
    return "\x1f".join(sorted(ids))


def plan_buddy_groups_rpc(
    msg: cluster_pb2.PlanBuddyGroupsRequest,
    limits: ServiceLimits,
    store: ClusterStore,
    time_remaining_s: float | None,
) -> cluster_pb2.PlanBuddyGroupsResponse:
    args = plan_request_from_proto(msg, limits)
    idempotency_key(msg.idempotency_key)
    call = KeyedCall.of("PlanBuddyGroups", msg.idempotency_key, msg) if msg.cluster_id else None
    if call is not None:
        # A retry is answered before planning again.
        replayed = store.replay(msg.cluster_id, call, cluster_pb2.PlanBuddyGroupsResponse)
        if replayed is not None:
            return replayed
    inputs = args.inputs
    budget = None if time_remaining_s is None else max(time_remaining_s - DEADLINE_MARGIN_S, 1e-4)
    started = time.perf_counter()
    if args.failed_ids:
        plan = replan_after_failure(inputs, args.failed_ids, budget)
        failed = set(args.failed_ids)
        inputs = ClusterInputs(
            instances=tuple(i for i in inputs.instances if i.id not in failed),
            param_bytes=inputs.param_bytes,
            num_layers=inputs.num_layers,
            profile=inputs.profile,
            required_bytes=inputs.required_bytes,
            strategy=inputs.strategy,
        )
    else:
        plan = plan_buddy_groups(inputs, budget)
    out = cluster_pb2.PlanBuddyGroupsResponse(kv_exchange_chunk_bytes=args.chunk_bytes)
    if args.compare_exact:
        left = None if budget is None else max(budget - (time.perf_counter() - started), 1e-4)
        exact_inputs = ClusterInputs(
            instances=inputs.instances,
            param_bytes=inputs.param_bytes,
            num_layers=inputs.num_layers,
            profile=inputs.profile,
            required_bytes=inputs.required_bytes,
            strategy=Strategy.EXACT,
        )
        exact = plan_buddy_groups(exact_inputs, left)
        if "out of time" not in exact.summary:
            out.exact_cost = exact.cost
            out.gap_to_exact = plan.cost / exact.cost - 1
    if args.max_batch:
        moves = rebalance(args.loads, args.max_batch)
        out.moves.extend(
            cluster_pb2.DispatchMove(source_id=m.source, target_id=m.target, requests=m.requests)
            for m in moves.moves
        )
        out.unplaced_requests = moves.unplaced
    num_layers = inputs.num_layers
    out.plan.CopyFrom(plan_to_proto(plan))
    if not msg.cluster_id:
        out.changes.extend(changes_to_proto(plan_transition(None, plan, num_layers)))
        return out

    def change(
        state: dict[str, Any] | None, revision: int
    ) -> tuple[dict[str, Any], cluster_pb2.PlanBuddyGroupsResponse]:
        old = _stored_plan(state) if state and state.get("num_layers") == num_layers else None
        new_state = state or _empty_state(num_layers)
        new_state["num_layers"] = num_layers
        new_state["plan"] = _plan_json(plan)
        # Groups changed: their restore hysteresis starts over.
        keys = {_group_key([m.instance_id for m in g.members]) for g in plan.groups}
        new_state["restore"] = {k: v for k, v in new_state.get("restore", {}).items() if k in keys}
        answer = cluster_pb2.PlanBuddyGroupsResponse()
        answer.CopyFrom(out)
        answer.changes.extend(changes_to_proto(plan_transition(old, plan, num_layers)))
        answer.revision = revision
        return new_state, answer

    return store.answer(msg.cluster_id, call, cluster_pb2.PlanBuddyGroupsResponse, change)


def evaluate_drop_trigger_rpc(
    msg: cluster_pb2.EvaluateDropTriggerRequest, limits: ServiceLimits, store: ClusterStore
) -> cluster_pb2.EvaluateDropTriggerResponse:
    cluster_id("cluster_id", msg.cluster_id)
    idempotency_key(msg.idempotency_key)
    check_memory_instances(msg, limits)
    config = trigger_config_from_proto(msg.params)

    def evaluate(monitors: dict[str, Any]) -> list[cluster_pb2.InstanceTrigger]:
        out = []
        for k, i in enumerate(msg.instances):
            stored = monitors.get(i.instance_id)
            monitor = (
                InstanceMonitor.from_dict(stored) if stored else InstanceMonitor(i.instance_id)
            )
            try:
                d = monitor.observe(
                    msg.now_s,
                    float(i.kv_used_bytes),
                    float(i.hbm_available_bytes),
                    config,
                    kv_rate_bytes_per_s=(
                        i.kv_rate_bytes_per_s if i.HasField("kv_rate_bytes_per_s") else None
                    ),
                    hbm_rate_bytes_per_s=(
                        i.hbm_rate_bytes_per_s if i.HasField("hbm_rate_bytes_per_s") else None
                    ),
                )
            except (ValueError, OverflowError) as exc:
                raise InvalidArgumentError("now_s", f"instances[{k}]: {exc}") from None
            monitors[i.instance_id] = monitor.to_dict()
            t = cluster_pb2.InstanceTrigger(
                instance_id=i.instance_id,
                drop=d.drop,
                kv_rate_bytes_per_s=d.kv_rate_bytes_per_s,
                hbm_rate_bytes_per_s=d.hbm_rate_bytes_per_s,
                # Rates derived over a tiny interval can predict more than
                # int64 holds; any shortfall that large is "all of it".
                shortfall_bytes=min(d.shortfall_bytes, MAX_BYTES),
            )
            tte = optional_seconds(d.time_to_exhaustion_s)
            if tte is not None:
                t.time_to_exhaustion_s = tte
            out.append(t)
        return out

    def respond(
        triggers: list[cluster_pb2.InstanceTrigger], revision: int
    ) -> cluster_pb2.EvaluateDropTriggerResponse:
        return cluster_pb2.EvaluateDropTriggerResponse(
            instances=triggers,
            drop=any(t.drop for t in triggers),
            required_bytes=min(sum(t.shortfall_bytes for t in triggers), MAX_BYTES),
            revision=revision,
        )

    if not msg.cluster_id:
        return respond(evaluate({}), 0)

    def change(
        state: dict[str, Any] | None, revision: int
    ) -> tuple[dict[str, Any], cluster_pb2.EvaluateDropTriggerResponse]:
        new_state = state or _empty_state(0)
        return new_state, respond(evaluate(new_state.setdefault("monitors", {})), revision)

    call = KeyedCall.of("EvaluateDropTrigger", msg.idempotency_key, msg)
    return store.answer(msg.cluster_id, call, cluster_pb2.EvaluateDropTriggerResponse, change)


def decide_restore_rpc(
    msg: cluster_pb2.DecideRestoreRequest, limits: ServiceLimits, store: ClusterStore
) -> cluster_pb2.DecideRestoreResponse:
    cluster_id("cluster_id", msg.cluster_id, required=True)
    idempotency_key(msg.idempotency_key)
    check_demand_instances(msg, limits)
    config = restore_config_from_proto(msg.params)
    by_id = {i.instance_id: i for i in msg.instances}

    def change(
        state: dict[str, Any] | None, revision: int
    ) -> tuple[dict[str, Any], cluster_pb2.DecideRestoreResponse]:
        response = cluster_pb2.DecideRestoreResponse(revision=revision)
        plan = _stored_plan(state)
        if state is None or plan is None:
            raise InvalidArgumentError(
                "cluster_id", f"no buddy plan stored for {msg.cluster_id!r} (PlanBuddyGroups first)"
            )
        restore = state.setdefault("restore", {})
        chosen = []
        for idx, g in enumerate(plan.groups):
            if g.size == 1:
                continue
            ids = [m.instance_id for m in g.members]
            missing = [x for x in ids if x not in by_id]
            if missing:
                raise InvalidArgumentError(
                    "instances", f"no demand for {missing[0]!r}, a member of a merged group"
                )
            key = _group_key(ids)
            monitor = RestoreMonitor.from_dict(restore.get(key, {}))
            d = monitor.observe(
                msg.now_s,
                float(sum(by_id[x].kv_demand_bytes for x in ids)),
                float(sum(by_id[x].kv_capacity_bytes for x in ids)),
                config,
                sum(by_id[x].kv_rate_bytes_per_s for x in ids),
            )
            restore[key] = monitor.to_dict()
            response.groups.append(
                cluster_pb2.GroupRestore(
                    instance_ids=ids,
                    restore=d.restore,
                    calm=d.calm,
                    calm_for_s=d.calm_for_s,
                    reason=d.reason,
                )
            )
            if d.restore:
                chosen.append(idx)
                restore.pop(key, None)
        new_plan = restore_groups(plan, chosen) if chosen else plan
        state["plan"] = _plan_json(new_plan)
        num_layers = int(state.get("num_layers", 0))
        response.plan.CopyFrom(plan_to_proto(new_plan))
        response.changes.extend(changes_to_proto(plan_transition(plan, new_plan, num_layers)))
        return state, response

    call = KeyedCall.of("DecideRestore", msg.idempotency_key, msg)
    return store.answer(msg.cluster_id, call, cluster_pb2.DecideRestoreResponse, change)


def get_cluster_state_rpc(
    msg: cluster_pb2.GetClusterStateRequest, store: ClusterStore
) -> cluster_pb2.GetClusterStateResponse:
    cluster_id("cluster_id", msg.cluster_id, required=True)
    state, revision = store.read(msg.cluster_id)
    out = cluster_pb2.GetClusterStateResponse(found=state is not None, revision=revision)
    if state is None:
        return out
    out.num_layers = int(state.get("num_layers", 0))
    if state.get("plan"):
        json_format.ParseDict(state["plan"], out.plan)
    for d in sorted(state.get("monitors", {}).values(), key=lambda d: d["instance_id"]):
        m = InstanceMonitor.from_dict(d)
        out.monitors.append(
            cluster_pb2.InstanceMonitorState(
                instance_id=m.instance_id,
                last_now_s=m.last_now_s or 0.0,
                last_kv_used_bytes=int(m.last_kv_used_bytes),
                last_hbm_available_bytes=int(m.last_hbm_available_bytes),
                kv_rate_bytes_per_s=m.kv_rate_bytes_per_s,
                hbm_rate_bytes_per_s=m.hbm_rate_bytes_per_s,
            )
        )
    return out
