"""ClusterService through a real gRPC server on loopback: buddy plans stored
per cluster with layer changes, the drop trigger's rates across calls,
restore hysteresis, failure re-plans, and bad input answered with
INVALID_ARGUMENT naming the field (the server keeps serving)."""

from __future__ import annotations

import json

import grpc
import pytest
from google.protobuf import json_format

from planner import cli
from planner.v1 import cluster_pb2, cluster_pb2_grpc, info_pb2, info_pb2_grpc

GB = 10**9
P = 28 * GB
PROFILE = [1.0, 1.8, 2.5, 3.1, 3.6, 4.0, 4.3, 4.5]


def plan_request(cluster_id: str = "", **overrides) -> cluster_pb2.PlanBuddyGroupsRequest:
    demand = [70, 20, 55, 35, 10, 45, 60, 30]
    msg = cluster_pb2.PlanBuddyGroupsRequest(
        cluster_id=cluster_id,
        instances=[
            cluster_pb2.ClusterInstance(
                id=f"i{j}", kv_capacity_bytes=40 * GB, kv_demand_bytes=d * GB
            )
            for j, d in enumerate(demand)
        ],
        param_bytes=P,
        num_layers=48,
        group_throughput=PROFILE,
    )
    for key, value in overrides.items():
        setattr(msg, key, value)
    return msg


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> cluster_pb2_grpc.ClusterServiceStub:
    return cluster_pb2_grpc.ClusterServiceStub(channel)


def layers(ranges) -> set[int]:
    return {x for r in ranges for x in range(r.start, r.end)}


def test_stateless_plan_explains_itself(stub):
    answer = stub.PlanBuddyGroups(plan_request(compare_exact=True), timeout=10)
    plan = answer.plan
    assert plan.strategy == cluster_pb2.BUDDY_STRATEGY_THROUGHPUT_GREEDY
    assert plan.required_bytes == 70 * GB
    assert [len(g.members) for g in plan.groups] == [2, 2, 2, 1, 1]
    assert plan.freed_bytes == 3 * P and plan.merges == 3 and plan.unmet_bytes == 0
    assert [[m.instance_id for m in g.members] for g in plan.groups][:3] == [
        ["i0", "i4"],
        ["i2", "i7"],
        ["i6", "i1"],
    ]
    first = plan.groups[0].members
    assert (first[0].first_layer, first[0].end_layer) == (0, 24)
    assert (first[1].first_layer, first[1].end_layer) == (24, 48)
    assert first[0].kept_bytes + first[1].kept_bytes == P
    assert plan.cost == pytest.approx(8 / (3 * 1.8 + 2))
    assert answer.exact_cost == pytest.approx(plan.cost)
    assert answer.gap_to_exact == pytest.approx(0.0)
    assert answer.revision == 0
    # From full replicas: each member of a merged group drops the others' layers.
    changes = {c.instance_id: c for c in answer.changes}
    assert set(changes) == {"i0", "i4", "i2", "i7", "i6", "i1"}
    assert layers(changes["i0"].drop) == set(range(24, 48))
    assert not changes["i0"].load


def test_exact_and_memory_greedy_and_scale_out(stub):
    exact = stub.PlanBuddyGroups(
        plan_request(required_bytes=5 * P, strategy=cluster_pb2.BUDDY_STRATEGY_EXACT), timeout=10
    ).plan
    assert sorted(len(g.members) for g in exact.groups) == [2, 3, 3]
    greedy = stub.PlanBuddyGroups(
        plan_request(required_bytes=5 * P, compare_exact=True), timeout=10
    )
    assert sorted(len(g.members) for g in greedy.plan.groups) == [2, 2, 4]
    assert greedy.gap_to_exact == pytest.approx(6.8 / 6.7 - 1)
    memory = stub.PlanBuddyGroups(
        plan_request(strategy=cluster_pb2.BUDDY_STRATEGY_MEMORY_GREEDY), timeout=10
    ).plan
    assert [len(g.members) for g in memory.groups] == [8]
    short = stub.PlanBuddyGroups(plan_request(required_bytes=50 * P), timeout=10).plan
    assert short.unmet_bytes == 43 * P and short.scale_out_instances > 0


def test_exchange_chunk_and_rebalance(stub):
    msg = plan_request()
    for i, inst in enumerate(msg.instances):
        inst.load_requests = [100, 10, 70, 40, 5, 50, 90, 30][i]
        inst.max_batch_requests = 64
    msg.exchange.CopyFrom(
        cluster_pb2.KvExchangeParams(link_gbps=25, activation_gap_s=0.002, align_bytes=4096)
    )
    answer = stub.PlanBuddyGroups(msg, timeout=10)
    assert answer.kv_exchange_chunk_bytes == 50_000_000 // 4096 * 4096
    moved = {}
    for m in answer.moves:
        moved[m.source_id] = moved.get(m.source_id, 0) + m.requests
    assert moved == {"i0": 36, "i6": 26, "i2": 6}
    assert answer.unplaced_requests == 0


def test_stored_plan_failure_replan_and_state(stub):
    cid = "cluster-failure"
    first = stub.PlanBuddyGroups(plan_request(cid, required_bytes=4 * P), timeout=10)
    assert first.revision == 1
    assert [len(g.members) for g in first.plan.groups] == [2, 2, 2, 2]
    failed = first.plan.groups[0].members[1].instance_id
    partner = first.plan.groups[0].members[0].instance_id
    msg = plan_request(cid, required_bytes=4 * P)
    msg.failed_instance_ids.append(failed)
    second = stub.PlanBuddyGroups(msg, timeout=10)
    assert second.revision == 2
    members = [m for g in second.plan.groups for m in g.members]
    assert failed not in {m.instance_id for m in members}
    assert len(members) == 7
    for g in second.plan.groups:
        assert g.members[0].first_layer == 0 and g.members[-1].end_layer == 48
        assert sum(m.kept_bytes for m in g.members) == P
    # The survivor of the broken pair loads what its new range needs.
    change = {c.instance_id: c for c in second.changes}
    old = first.plan.groups[0].members[0]
    new = next(m for m in members if m.instance_id == partner)
    need = set(range(new.first_layer, new.end_layer)) - set(range(old.first_layer, old.end_layer))
    assert (layers(change[partner].load) if partner in change else set()) == need
    state = stub.GetClusterState(cluster_pb2.GetClusterStateRequest(cluster_id=cid), timeout=10)
    assert state.found and state.revision == 2 and state.num_layers == 48
    assert state.plan == second.plan
    missing = stub.GetClusterState(
        cluster_pb2.GetClusterStateRequest(cluster_id="never-seen"), timeout=10
    )
    assert not missing.found and missing.revision == 0


def test_drop_trigger_remembers_rates_per_cluster(stub):
    cid = "cluster-trigger"

    def observe(now_s: float, kv_gb: float) -> cluster_pb2.EvaluateDropTriggerResponse:
        return stub.EvaluateDropTrigger(
            cluster_pb2.EvaluateDropTriggerRequest(
                cluster_id=cid,
                now_s=now_s,
                instances=[
                    cluster_pb2.InstanceMemory(
                        instance_id="a",
                        kv_used_bytes=int(kv_gb * GB),
                        hbm_available_bytes=80 * GB,
                    ),
                    cluster_pb2.InstanceMemory(
                        instance_id="b", kv_used_bytes=10 * GB, hbm_available_bytes=80 * GB
                    ),
                ],
            ),
            timeout=10,
        )

    first = observe(10.0, 40)
    assert not first.drop and not first.instances[0].HasField("time_to_exhaustion_s")
    second = observe(11.0, 60)  # 20 GB/s, 20 GB left: exactly 1 s
    a, b = second.instances
    assert a.drop and a.time_to_exhaustion_s == pytest.approx(1.0)
    assert a.kv_rate_bytes_per_s == pytest.approx(20 * GB)
    assert not b.drop
    assert second.drop and second.required_bytes == 0
    third = observe(11.5, 75)  # 30 GB/s, 5 GB left: short by 25 GB in 1 s
    assert third.required_bytes == 25 * GB
    assert third.revision == 3
    # Time going backwards names the field.
    with pytest.raises(grpc.RpcError) as err:
        observe(11.0, 75)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("now_s")
    # A stateless call with measured rates needs no history.
    stateless = stub.EvaluateDropTrigger(
        cluster_pb2.EvaluateDropTriggerRequest(
            now_s=0.0,
            instances=[
                cluster_pb2.InstanceMemory(
                    instance_id="a",
                    kv_used_bytes=70 * GB,
                    hbm_available_bytes=80 * GB,
                    kv_rate_bytes_per_s=5 * GB,
                    hbm_rate_bytes_per_s=-10 * GB,
                )
            ],
            params=cluster_pb2.TriggerParams(horizon_s=0.5),
        ),
        timeout=10,
    )
    assert stateless.instances[0].time_to_exhaustion_s == pytest.approx(10 / 15)
    assert not stateless.drop and stateless.revision == 0


def test_shortfalls_past_the_byte_limit_sum_to_all_of_it(stub):
    """Two instances each short by as much as a byte count may say (2^62):
    their sum is capped there too, not an int64 overflow (INTERNAL)."""
    huge = cluster_pb2.InstanceMemory(
        kv_used_bytes=2**61,
        hbm_available_bytes=2**61 + GB,
        kv_rate_bytes_per_s=float(2**62),
        hbm_rate_bytes_per_s=-float(2**62),
    )
    a, b = cluster_pb2.InstanceMemory(), cluster_pb2.InstanceMemory()
    a.CopyFrom(huge)
    b.CopyFrom(huge)
    a.instance_id, b.instance_id = "a", "b"
    response = stub.EvaluateDropTrigger(
        cluster_pb2.EvaluateDropTriggerRequest(
            now_s=0.0, instances=[a, b], params=cluster_pb2.TriggerParams(horizon_s=4.0)
        ),
        timeout=10,
    )
    shortfalls = [t.shortfall_bytes for t in response.instances]
    assert shortfalls == [2**62, 2**62]
    assert response.drop and response.required_bytes == 2**62


def test_restore_with_hysteresis_updates_the_stored_plan(stub):
    cid = "cluster-restore"
    plan = stub.PlanBuddyGroups(plan_request(cid, required_bytes=P), timeout=10).plan
    pair = [m.instance_id for m in plan.groups[0].members]
    assert len(pair) == 2

    def decide(now_s: float, demand_gb: int) -> cluster_pb2.DecideRestoreResponse:
        return stub.DecideRestore(
            cluster_pb2.DecideRestoreRequest(
                cluster_id=cid,
                now_s=now_s,
                instances=[
                    cluster_pb2.InstanceDemand(
                        instance_id=x, kv_demand_bytes=demand_gb * GB, kv_capacity_bytes=40 * GB
                    )
                    for x in pair
                ],
                params=cluster_pb2.RestoreParams(hold_s=2.0),
            ),
            timeout=10,
        )

    busy = decide(0.0, 35)  # 70 of 80 GB: above 70% x 80 = 56
    assert [g.restore for g in busy.groups] == [False] and not busy.groups[0].calm
    assert not decide(1.0, 20).groups[0].restore  # calm from t = 1
    assert not decide(2.5, 20).groups[0].restore
    done = decide(3.0, 20)
    assert done.groups[0].restore and done.groups[0].calm_for_s == pytest.approx(2.0)
    assert [len(g.members) for g in done.plan.groups] == [1] * 8
    assert layers(next(c for c in done.changes if c.instance_id == pair[0]).load) == set(
        range(24, 48)
    )
    state = stub.GetClusterState(cluster_pb2.GetClusterStateRequest(cluster_id=cid), timeout=10)
    assert [len(g.members) for g in state.plan.groups] == [1] * 8
    # Nothing merged any more: nothing to decide.
    assert not decide(4.0, 20).groups


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda m: m.instances.add(id="i0"), "instances[8].id"),
        (lambda m: setattr(m.instances[2], "kv_demand_bytes", -1), "instances[2].kv_demand_bytes"),
        (lambda m: setattr(m.instances[1], "throughput_scale", float("nan")), "instances[1]"),
        (lambda m: setattr(m, "param_bytes", 0), "param_bytes"),
        (lambda m: setattr(m, "num_layers", 0), "num_layers"),
        (lambda m: m.ClearField("group_throughput"), "group_throughput"),
        (lambda m: m.group_throughput.__setitem__(2, 0.0), "group_throughput[2]"),
        (lambda m: setattr(m, "required_bytes", -5), "required_bytes"),
        (lambda m: setattr(m, "strategy", 99), "strategy"),
        (lambda m: m.failed_instance_ids.append("ghost"), "failed_instance_ids[0]"),
        (lambda m: setattr(m.exchange, "link_gbps", -1.0), "exchange.link_gbps"),
        (lambda m: setattr(m.exchange, "link_gbps", 10.0), "exchange.activation_gap_s"),
        (lambda m: setattr(m, "cluster_id", "x" * 300), "cluster_id"),
        (lambda m: m.ClearField("instances"), "instances"),
    ],
)
def test_bad_plan_input_names_the_field(stub, mutate, field):
    msg = plan_request()
    mutate(msg)
    with pytest.raises(grpc.RpcError) as err:
        stub.PlanBuddyGroups(msg, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(field)
    assert stub.PlanBuddyGroups(plan_request(), timeout=10).plan.groups


def test_heterogeneous_exact_too_large_names_strategy(stub):
    msg = plan_request(strategy=cluster_pb2.BUDDY_STRATEGY_EXACT)
    for j in range(4):
        msg.instances.add(id=f"x{j}", throughput_scale=0.5)
    with pytest.raises(grpc.RpcError) as err:
        stub.PlanBuddyGroups(msg, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("strategy")


@pytest.mark.parametrize(
    ("request_", "method", "field"),
    [
        (
            cluster_pb2.DecideRestoreRequest(now_s=1.0),
            "DecideRestore",
            "cluster_id",
        ),
        (
            cluster_pb2.DecideRestoreRequest(cluster_id="no-plan-here", now_s=1.0),
            "DecideRestore",
            "cluster_id",
        ),
        (
            cluster_pb2.EvaluateDropTriggerRequest(
                now_s=float("inf"), instances=[cluster_pb2.InstanceMemory(instance_id="a")]
            ),
            "EvaluateDropTrigger",
            "now_s",
        ),
        (
            cluster_pb2.EvaluateDropTriggerRequest(
                instances=[cluster_pb2.InstanceMemory(instance_id="a", kv_used_bytes=-1)]
            ),
            "EvaluateDropTrigger",
            "instances[0].kv_used_bytes",
        ),
        (
            cluster_pb2.EvaluateDropTriggerRequest(
                instances=[cluster_pb2.InstanceMemory(instance_id="")]
            ),
            "EvaluateDropTrigger",
            "instances[0].instance_id",
        ),
        (
            cluster_pb2.EvaluateDropTriggerRequest(params=cluster_pb2.TriggerParams(ewma_weight=0)),
            "EvaluateDropTrigger",
            "params.ewma_weight",
        ),
        (cluster_pb2.GetClusterStateRequest(), "GetClusterState", "cluster_id"),
    ],
)
def test_bad_trigger_restore_state_input_names_the_field(stub, request_, method, field):
    with pytest.raises(grpc.RpcError) as err:
        getattr(stub, method)(request_, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(field)


def test_restore_needs_every_member_of_a_merged_group(stub):
    cid = "cluster-restore-missing"
    stub.PlanBuddyGroups(plan_request(cid, required_bytes=P), timeout=10)
    with pytest.raises(grpc.RpcError) as err:
        stub.DecideRestore(cluster_pb2.DecideRestoreRequest(cluster_id=cid, now_s=0), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("instances")
    # The failed call changed nothing.
    state = stub.GetClusterState(cluster_pb2.GetClusterStateRequest(cluster_id=cid), timeout=10)
    assert state.revision == 1


def test_expired_deadline_is_deadline_exceeded(stub):
    with pytest.raises(grpc.RpcError) as err:
        stub.PlanBuddyGroups(plan_request(), timeout=-1)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_info_lists_the_service_and_policy(channel):
    info = info_pb2_grpc.PlannerInfoServiceStub(channel).GetPlannerInfo(
        info_pb2.GetPlannerInfoRequest(), timeout=10
    )
    assert "planner.v1.ClusterService" in info.services
    assert "cluster/kunserve" in info.policies


def test_planner_call_in_process_with_a_store(tmp_path, capsys):
    """`planner call` answers ClusterService from JSON, and with --store the
    state outlives the call (run through the CLI's main, in process)."""
    store = tmp_path / "cluster.sqlite3"
    request = tmp_path / "plan.json"
    request.write_text(json_format.MessageToJson(plan_request("cli")), encoding="utf-8")
    args = ["call", "ClusterService.PlanBuddyGroups", "--json", str(request)]
    assert cli.main([*args, "--store", str(store)]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["merges"] == 3
    ask = tmp_path / "state.json"
    ask.write_text('{"cluster_id": "cli"}', encoding="utf-8")
    get = ["call", "ClusterService.GetClusterState", "--json", str(ask)]
    assert cli.main([*get, "--store", str(store)]) == 0
    state = json.loads(capsys.readouterr().out)
    assert state["found"] is True and state["revision"] == "1"
    bad = tmp_path / "bad.json"
    bad.write_text('{"param_bytes": 1}', encoding="utf-8")
    assert cli.main(["call", "ClusterService.PlanBuddyGroups", "--json", str(bad)]) == 2
    assert capsys.readouterr().err.startswith("planner call: instances:")
