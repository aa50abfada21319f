"""PlannerClient (and the adapters' PlannerChannel) with several planner
replicas: calls are balanced round robin over real servers on loopback,
calls of the services that keep per-engine state stay on their engine's
replica (a stable hash of its id) and move to the next choice only when it
is down, and every RPC that touches per-engine state has an affinity
key."""

from __future__ import annotations

import pytest
from planner.adapters.common.channel import PlannerChannel
from planner.adapters.common.counters import FallbackCounters
from valid_requests import ENGINE, GPU, VALID

from planner.affinity import AFFINITY_FIELDS, affinity_key, rendezvous_order
from planner.cli import main
from planner.client import PlannerClient, RetryPolicy
from planner.rpc import RPCS
from planner.service.limits import ServiceLimits
from planner.service.methods import CallContext, handle
from planner.service.offload_engines import OffloadEngines
from planner.service.serverless_tuners import ServerlessTuners
from planner.targets import TargetError, resolve, split_targets
from planner.v1 import info_pb2, offload_pb2

INFO = RPCS["PlannerInfoService.GetPlannerInfo"]
PLAN = RPCS["OffloadService.PlanLayerOffload"]
REPORT = RPCS["OffloadService.ReportStep"]


def started(server, rpc) -> int:
    value = server.metrics.registry.get_sample_value(
        "grpc_server_started_total",
        {"grpc_type": "unary", "grpc_service": rpc.full_service, "grpc_method": rpc.name},
    )
    return int(value or 0)


def by_address(servers):
    return {s.address: s for s in servers}


def test_calls_are_balanced_round_robin_over_every_replica(start_server):
    servers = [start_server() for _ in range(3)]
    with PlannerClient([s.address for s in servers], deadline_s=10) as client:
        # Until each replica is connected, round robin uses those that are.
        for _ in range(300):
            if all(started(s, INFO) for s in servers):
                break
            client.info()
        assert all(started(s, INFO) for s in servers)
        before = [started(s, INFO) for s in servers]
        for _ in range(30):
            client.info()
        assert [started(s, INFO) - b for s, b in zip(servers, before, strict=True)] == [10] * 3


def test_an_engine_stays_on_its_replica_and_moves_once_when_it_is_down(start_server):
    servers = [start_server() for _ in range(3)]
    addresses = [s.address for s in servers]
    plan = VALID["OffloadService.PlanLayerOffload"]()
    report = offload_pb2.ReportStepRequest(
        engine_id=ENGINE, step=6, observed_step_s=0.02, batch_ids=["long", "short"]
    )
    with PlannerClient(addresses, deadline_s=30) as client:
        order = rendezvous_order(affinity_key(PLAN, plan), client.replicas.addresses)
        assert client.preferred_replica(PLAN, plan) == order[0]
        home, fallback = by_address(servers)[order[0]], by_address(servers)[order[1]]
        client.call(PLAN, plan)
        for _ in range(5):
            # The controller that made the plan answers: no NO_PLAN replan.
            answer = client.call(REPORT, report)
            assert answer.reason != offload_pb2.REPLAN_REASON_NO_PLAN
        assert started(home, PLAN) == 1 and started(home, REPORT) == 5
        assert sum(started(s, REPORT) for s in servers) == 5
        home.stop(grace_s=0)
        # Its next choice answers now: it has no plan for the engine yet.
        assert client.call(REPORT, report).reason == offload_pb2.REPLAN_REASON_NO_PLAN
        client.call(PLAN, plan)
        assert client.call(REPORT, report).reason != offload_pb2.REPLAN_REASON_NO_PLAN
        assert started(fallback, PLAN) == 1 and started(fallback, REPORT) == 2


def test_engines_spread_over_the_replicas_as_every_client_agrees(start_server):
    servers = [start_server() for _ in range(3)]
    addresses = [s.address for s in servers]
    engines = [f"engine-{k}" for k in range(30)]
    with (
        PlannerClient(addresses, deadline_s=30) as one,
        PlannerClient(list(reversed(addresses)), deadline_s=30) as other,
    ):
        for engine in engines:
            request = offload_pb2.ReportStepRequest(engine_id=engine, step=1, observed_step_s=0.01)
            assert one.preferred_replica(REPORT, request) == other.preferred_replica(
                REPORT, request
            )
            one.call(REPORT, request)
            other.call(REPORT, request)
        homes = [
            one.preferred_replica(REPORT, offload_pb2.ReportStepRequest(engine_id=e))
            for e in engines
        ]
    for server in servers:
        assert started(server, REPORT) == 2 * homes.count(server.address) > 0


def test_the_adapters_channel_takes_several_targets(start_server):
    servers = [start_server() for _ in range(2)]
    counters = FallbackCounters()
    report = offload_pb2.ReportStepRequest(engine_id=ENGINE, step=1, observed_step_s=0.01)
    with PlannerChannel(",".join(s.address for s in servers), deadline_s=10) as channel:
        for _ in range(4):
            assert channel.call(REPORT, report, counters) is not None
            assert channel.call(INFO, info_pb2.GetPlannerInfoRequest(), counters) is not None
    assert sorted(started(s, REPORT) for s in servers) == [0, 4]
    assert sum(started(s, INFO) for s in servers) == 4


def test_a_replica_that_is_down_is_skipped(start_server):
    """Round robin sends nothing to a replica it cannot connect to."""
    healthy = start_server()
    down = start_server()
    down.stop(grace_s=0)
    with PlannerClient(
        [down.address, healthy.address], deadline_s=10, retry=RetryPolicy(max_attempts=3)
    ) as client:
        for _ in range(10):
            assert client.info().version
    assert started(healthy, INFO) == 10


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("127.0.0.1:1,127.0.0.1:1", "given twice"),
        ("127.0.0.1:1,dns:///x:2", "no URI scheme"),
        ("127.0.0.1:1,127.0.0.1:x", "not a number"),
        ("127.0.0.1:1,::1:2", "in brackets"),
        ("127.0.0.1:1,[::1]:2", "share no IP family"),
        (" , ", "no planner target"),
        ("127.0.0.1:1,host.invalid:2", "cannot resolve"),
    ],
)
def test_unusable_targets_are_refused_naming_them(target, message):
    with pytest.raises(TargetError, match=message):
        PlannerClient(target)


def test_targets_resolve_to_one_address_family():
    assert split_targets(" a:1, b:2 ") == ("a:1", "b:2")
    replicas = resolve(["localhost:5001", "127.0.0.2:5002"])
    assert replicas.addresses == ("127.0.0.1:5001", "127.0.0.2:5002")
    assert replicas.channel_target() == "ipv4:127.0.0.1:5001,127.0.0.2:5002"
    six = resolve(["[::1]:5001", "[::1]:5002"])
    assert six.channel_target() == "ipv6:[::1]:5001,[::1]:5002"


class _Watched:
    """Marks any public use of a per-engine registry."""

    touched = False

    def __getattribute__(self, name: str):
        if not name.startswith("_") and name != "touched":
            object.__setattr__(self, "touched", True)
        return super().__getattribute__(name)


class WatchedEngines(_Watched, OffloadEngines):
    pass


class WatchedTuners(_Watched, ServerlessTuners):
    pass


def test_every_rpc_that_uses_per_engine_state_has_an_affinity_key():
    """Each RPC's valid request (in the order that makes each valid) in
    process, on registries that notice being used."""
    engines, tuners = WatchedEngines(), WatchedTuners()
    ctx = CallContext(ServiceLimits(), 30.0, engines, serverless_tuners=tuners)
    for method, build in VALID.items():
        object.__setattr__(engines, "touched", False)
        object.__setattr__(tuners, "touched", False)
        request = build()
        handle(RPCS[method], request, ctx)
        uses_state = engines.touched or tuners.touched
        assert uses_state == (method in AFFINITY_FIELDS), method
        if uses_state:
            key = affinity_key(RPCS[method], request)
            assert key is not None and (ENGINE in key or GPU in key)


def test_a_call_without_an_engine_id_is_balanced(start_server):
    servers = [start_server() for _ in range(2)]
    what_if = VALID["OffloadService.PlanLayerOffload"]()
    what_if.engine_id = ""
    with PlannerClient([s.address for s in servers], deadline_s=30) as client:
        assert client.preferred_replica(PLAN, what_if) is None
        for _ in range(200):
            if all(started(s, INFO) for s in servers):
                break
            client.info()
        for _ in range(4):
            client.call(PLAN, what_if)
    assert [started(s, PLAN) for s in servers] == [2, 2]


def test_a_single_target_uri_is_passed_to_grpc_as_it_is(start_server):
    server = start_server()
    with PlannerClient(f"dns:///{server.address}", deadline_s=10) as client:
        assert client.replicas is None
        assert client.info().version


def test_planner_call_takes_several_targets(start_server, tmp_path, capsys):
    servers = [start_server() for _ in range(2)]
    request = tmp_path / "info.json"
    request.write_text("{}", encoding="utf-8")
    targets = ",".join(s.address for s in servers)
    for _ in range(2):
        argv = ["call", "PlannerInfoService.GetPlannerInfo", "--json", str(request)]
        assert main([*argv, "--target", targets]) == 0
        assert '"version"' in capsys.readouterr().out
    assert sum(started(s, INFO) for s in servers) == 2
