"""ClusterService's idempotency keys through a real gRPC server on loopback:
a repeated PlanBuddyGroups, EvaluateDropTrigger or DecideRestore gets its
original answer (replayed = true) and changes nothing; the same key with
other content is INVALID_ARGUMENT (idempotency_key); a rejected call leaves
its key unused; keys are per cluster, survive a restart on the same store,
and are remembered for a cluster's last KEEP_KEYED_CALLS keyed calls."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stores import STORES, rows_of

from planner.policies.buddy.controller import InstanceMonitor, TriggerConfig
from planner.service.cluster_methods import evaluate_drop_trigger_rpc
from planner.service.cluster_store import KEEP_KEYED_CALLS, ClusterStore
from planner.service.limits import MAX_ID_LENGTH, ServiceLimits
from planner.service.server import PlannerServer, ServerConfig
from planner.v1 import cluster_pb2, cluster_pb2_grpc

GB = 10**9
P = 28 * GB
PROFILE = [1.0, 1.8, 2.5, 3.1, 3.6, 4.0, 4.3, 4.5]
DEMAND_GB = [70, 20, 55, 35, 10, 45, 60, 30]
IDS = [f"i{j}" for j in range(len(DEMAND_GB))]
TIMEOUT_S = 10
EWMA = 0.5
Stub = cluster_pb2_grpc.ClusterServiceStub


def plan_request(cid: str, key: str = "", replicas: int = 1) -> cluster_pb2.PlanBuddyGroupsRequest:
    """replicas: how many replicas' worth of parameters to free."""
    return cluster_pb2.PlanBuddyGroupsRequest(
        cluster_id=cid,
        idempotency_key=key,
        instances=[
            cluster_pb2.ClusterInstance(id=i, kv_capacity_bytes=40 * GB, kv_demand_bytes=d * GB)
            for i, d in zip(IDS, DEMAND_GB, strict=True)
        ],
        param_bytes=P,
        num_layers=48,
        group_throughput=PROFILE,
        required_bytes=replicas * P,
    )


def observe_request(
    cid: str, key: str, now_s: float, kv_gb: int = 30
) -> cluster_pb2.EvaluateDropTriggerRequest:
    return cluster_pb2.EvaluateDropTriggerRequest(
        cluster_id=cid,
        idempotency_key=key,
        now_s=now_s,
        instances=[
            cluster_pb2.InstanceMemory(
                instance_id="i0", kv_used_bytes=kv_gb * GB, hbm_available_bytes=50 * GB
            )
        ],
        params=cluster_pb2.TriggerParams(ewma_weight=EWMA),
    )


def restore_request(
    cid: str, key: str, now_s: float, demand_gb: int = 10
) -> cluster_pb2.DecideRestoreRequest:
    """Every instance's demand; hold_s 0: calm groups restore at once."""
    return cluster_pb2.DecideRestoreRequest(
        cluster_id=cid,
        idempotency_key=key,
        now_s=now_s,
        instances=[
            cluster_pb2.InstanceDemand(
                instance_id=i, kv_demand_bytes=demand_gb * GB, kv_capacity_bytes=40 * GB
            )
            for i in IDS
        ],
        params=cluster_pb2.RestoreParams(hold_s=0.0),
    )


def state(stub: Stub, cid: str) -> cluster_pb2.GetClusterStateResponse:
    return stub.GetClusterState(
        cluster_pb2.GetClusterStateRequest(cluster_id=cid), timeout=TIMEOUT_S
    )


def as_original(answer):
    """The answer with its replayed flag cleared, to compare with the first."""
    copy = type(answer)()
    copy.CopyFrom(answer)
    copy.replayed = False
    return copy


def rejected(call, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call(request, timeout=TIMEOUT_S)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return err.value


@pytest.fixture(scope="module", params=STORES)
def stub(request: pytest.FixtureRequest) -> Iterator[Stub]:
    """A server of the module (in-memory SQLite, or a PostgreSQL database)."""
    if request.param == "sqlite":
        yield cluster_pb2_grpc.ClusterServiceStub(request.getfixturevalue("channel"))
        return
    url = request.getfixturevalue("postgresql").create_database()
    server = PlannerServer(ServerConfig(host="127.0.0.1", port=0, store_path=url))
    server.start()
    with grpc.insecure_channel(server.address) as channel:
        yield cluster_pb2_grpc.ClusterServiceStub(channel)
    server.stop(grace_s=1.0)


class StoredServer:
    """A PlannerServer on a store file, restartable in process."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.server: PlannerServer | None = None
        self.channel: grpc.Channel | None = None

    def start(self) -> Stub:
        self.server = PlannerServer(
            ServerConfig(host="127.0.0.1", port=0, store_path=str(self.path))
        )
        self.server.start()
        self.channel = grpc.insecure_channel(self.server.address)
        return cluster_pb2_grpc.ClusterServiceStub(self.channel)

    def stop(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.server is not None:
            self.server.stop(grace_s=1.0)
            self.server = None


@pytest.fixture
def stored(store_location: str) -> Iterator[StoredServer]:
    s = StoredServer(store_location)
    yield s
    s.stop()


def test_repeated_plan_is_replayed_and_changes_nothing(stub):
    cid = "idem-plan"
    first = stub.PlanBuddyGroups(plan_request(cid, "p1", replicas=1), timeout=TIMEOUT_S)
    assert first.revision == 1 and not first.replayed
    again = stub.PlanBuddyGroups(plan_request(cid, "p1", replicas=1), timeout=TIMEOUT_S)
    assert again.replayed and as_original(again) == first
    assert state(stub, cid).revision == 1
    # A new plan under a new key; its changes are from the first plan.
    second = stub.PlanBuddyGroups(plan_request(cid, "p2", replicas=3), timeout=TIMEOUT_S)
    assert second.revision == 2 and not second.replayed
    assert second.plan.merges == 3 and first.plan.merges == 1
    moved = {c.instance_id for c in second.changes}
    assert moved and moved != {c.instance_id for c in first.changes}
    # A late retry of the first call gets the first answer and leaves the
    # second plan in place.
    late = stub.PlanBuddyGroups(plan_request(cid, "p1", replicas=1), timeout=TIMEOUT_S)
    assert late.replayed and as_original(late) == first
    now = state(stub, cid)
    assert now.revision == 2 and now.plan == second.plan


def test_repeated_observation_feeds_the_trigger_once(stub):
    cid = "idem-observe"
    a = stub.EvaluateDropTrigger(observe_request(cid, "o1", 0.0, kv_gb=20), timeout=TIMEOUT_S)
    b = stub.EvaluateDropTrigger(observe_request(cid, "o2", 1.0, kv_gb=30), timeout=TIMEOUT_S)
    assert (a.revision, b.revision) == (1, 2)
    for _ in range(2):
        again = stub.EvaluateDropTrigger(
            observe_request(cid, "o2", 1.0, kv_gb=30), timeout=TIMEOUT_S
        )
        assert again.replayed and as_original(again) == b
    c = stub.EvaluateDropTrigger(observe_request(cid, "o3", 2.0, kv_gb=45), timeout=TIMEOUT_S)
    assert c.revision == 3
    want = InstanceMonitor("i0")
    config = TriggerConfig(ewma_weight=EWMA)
    for now_s, kv in [(0.0, 20), (1.0, 30), (2.0, 45)]:
        want.observe(now_s, float(kv * GB), float(50 * GB), config)
    (got,) = state(stub, cid).monitors
    assert (got.last_now_s, got.kv_rate_bytes_per_s) == (2.0, want.kv_rate_bytes_per_s)
    # The EWMA from 0: 5 GB/s after t = 1, then half of that and half of 15.
    assert got.kv_rate_bytes_per_s == pytest.approx(10 * GB)


def test_repeated_restore_is_replayed_not_restored_again(stub):
    cid = "idem-restore"
    planned = stub.PlanBuddyGroups(plan_request(cid, "p", replicas=2), timeout=TIMEOUT_S)
    assert planned.plan.merges == 2
    done = stub.DecideRestore(restore_request(cid, "r1", 0.0), timeout=TIMEOUT_S)
    assert [g.restore for g in done.groups] == [True, True] and done.revision == 2
    assert done.plan.merges == 0 and done.changes
    again = stub.DecideRestore(restore_request(cid, "r1", 0.0), timeout=TIMEOUT_S)
    assert again.replayed and as_original(again) == done
    # Applied again, the call would find no merged group left.
    fresh = stub.DecideRestore(restore_request(cid, "r2", 0.0), timeout=TIMEOUT_S)
    assert not fresh.groups and fresh.revision == 3
    assert state(stub, cid).revision == 3


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (
            lambda c: ("PlanBuddyGroups", plan_request(c, "k", replicas=1)),
            lambda c: ("PlanBuddyGroups", plan_request(c, "k", replicas=2)),
        ),
        (
            lambda c: ("EvaluateDropTrigger", observe_request(c, "k", 1.0)),
            lambda c: ("EvaluateDropTrigger", observe_request(c, "k", 1.0, kv_gb=31)),
        ),
        (
            lambda c: ("DecideRestore", restore_request(c, "k", 1.0)),
            lambda c: ("DecideRestore", restore_request(c, "k", 2.0)),
        ),
        (
            lambda c: ("EvaluateDropTrigger", observe_request(c, "k", 1.0)),
            lambda c: ("DecideRestore", restore_request(c, "k", 1.0)),
        ),
    ],
    ids=["plan", "observe", "restore", "other-method"],
)
def test_same_key_other_content_is_invalid_argument(stub, first, second):
    cid = f"idem-conflict-{first('x')[0]}-{second('x')[0]}"
    stub.PlanBuddyGroups(plan_request(cid, "setup", replicas=2), timeout=TIMEOUT_S)
    method, request = first(cid)
    getattr(stub, method)(request, timeout=TIMEOUT_S)
    before = state(stub, cid)
    method, request = second(cid)
    err = rejected(getattr(stub, method), request)
    assert err.details().startswith("idempotency_key"), err.details()
    assert "'k'" in err.details()
    assert state(stub, cid) == before


def test_a_rejected_call_does_not_use_up_its_key(stub):
    cid = "idem-rejected"
    # No plan yet: rejected inside the store's transaction.
    err = rejected(stub.DecideRestore, restore_request(cid, "r", 0.0))
    assert err.details().startswith("cluster_id")
    stub.PlanBuddyGroups(plan_request(cid, "p", replicas=1), timeout=TIMEOUT_S)
    done = stub.DecideRestore(restore_request(cid, "r", 0.0), timeout=TIMEOUT_S)
    assert not done.replayed and done.revision == 2 and done.groups[0].restore
    # An observation before the last one: rejected by the trigger, mid-change.
    stub.EvaluateDropTrigger(observe_request(cid, "o1", 5.0), timeout=TIMEOUT_S)
    err = rejected(stub.EvaluateDropTrigger, observe_request(cid, "o2", 4.0))
    assert err.details().startswith("now_s")
    assert state(stub, cid).revision == 3
    ok = stub.EvaluateDropTrigger(observe_request(cid, "o2", 4.0 + 2), timeout=TIMEOUT_S)
    assert not ok.replayed and ok.revision == 4


def test_key_longer_than_an_id_is_invalid_argument(stub):
    long_key = "k" * (MAX_ID_LENGTH + 1)
    for call, request in [
        (stub.PlanBuddyGroups, plan_request("idem-long", long_key)),
        (stub.EvaluateDropTrigger, observe_request("idem-long", long_key, 0.0)),
        (stub.DecideRestore, restore_request("idem-long", long_key, 0.0)),
    ]:
        assert rejected(call, request).details().startswith("idempotency_key")
    assert not state(stub, "idem-long").found
    ok = stub.PlanBuddyGroups(plan_request("idem-long", "k" * MAX_ID_LENGTH), timeout=TIMEOUT_S)
    assert ok.revision == 1


def test_keys_are_per_cluster_and_empty_keys_always_apply(stub):
    a = stub.EvaluateDropTrigger(observe_request("idem-a", "same", 0.0), timeout=TIMEOUT_S)
    b = stub.EvaluateDropTrigger(observe_request("idem-b", "same", 0.0), timeout=TIMEOUT_S)
    assert (a.replayed, b.replayed, a.revision, b.revision) == (False, False, 1, 1)
    for revision in (1, 2):
        plain = stub.PlanBuddyGroups(plan_request("idem-plain"), timeout=TIMEOUT_S)
        assert plain.revision == revision and not plain.replayed
    # A stateless call changes nothing; its key is not recorded anywhere.
    for _ in range(2):
        what_if = stub.PlanBuddyGroups(plan_request("", "w"), timeout=TIMEOUT_S)
        assert what_if.revision == 0 and not what_if.replayed


def test_replays_survive_a_restart_on_the_same_store(stored):
    cid = "restarted"
    stub = stored.start()
    calls = [
        ("PlanBuddyGroups", plan_request(cid, "p", replicas=2)),
        ("EvaluateDropTrigger", observe_request(cid, "o", 1.0)),
        ("DecideRestore", restore_request(cid, "r", 1.0)),
    ]
    answers = [getattr(stub, method)(request, timeout=TIMEOUT_S) for method, request in calls]
    before = state(stub, cid)
    assert before.revision == 3
    stored.stop()
    stub = stored.start()
    for (method, request), answer in zip(calls, answers, strict=True):
        again = getattr(stub, method)(request, timeout=TIMEOUT_S)
        assert again.replayed and as_original(again) == answer
    assert state(stub, cid) == before


def test_a_cluster_remembers_its_last_keyed_calls_only(store_location):
    store = ClusterStore(store_location)
    limits = ServiceLimits()
    calls = KEEP_KEYED_CALLS + 1
    for k in range(calls):
        evaluate_drop_trigger_rpc(observe_request("c", f"o{k}", float(k)), limits, store)
    assert rows_of(store, "SELECT COUNT(*) FROM cluster_request") == [(str(KEEP_KEYED_CALLS),)]
    newest = evaluate_drop_trigger_rpc(observe_request("c", "o1", 1.0), limits, store)
    assert newest.replayed and newest.revision == 2
    # The oldest record is gone: its key is usable again.
    reused = evaluate_drop_trigger_rpc(observe_request("c", "o0", float(calls)), limits, store)
    assert not reused.replayed and reused.revision == calls + 1
    store.close()


# ---- property: repeats change nothing ---------------------------------------------

_clusters = itertools.count()
# A unique call: ("plan", replicas) | ("observe", KV GB) | ("restore", demand GB).
_calls = st.one_of(
    st.tuples(st.just("plan"), st.integers(0, 4)),
    st.tuples(st.just("observe"), st.integers(0, 60)),
    st.tuples(st.just("restore"), st.integers(0, 40)),
)
# Each unique call, then the indices (into the calls so far) of the retries
# that follow it.
_steps = st.lists(st.tuples(_calls, st.lists(st.integers(0, 1000), max_size=3)), max_size=10)


def _request(cid: str, k: int, call: tuple[str, int]):
    """The k-th unique call; k orders the clocks, so every call is valid."""
    kind, value = call
    if kind == "plan":
        return "PlanBuddyGroups", plan_request(cid, f"k{k}", replicas=value)
    if kind == "observe":
        return "EvaluateDropTrigger", observe_request(cid, f"k{k}", float(k), kv_gb=value)
    return "DecideRestore", restore_request(cid, f"k{k}", float(k), demand_gb=value)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_steps)
def test_repeats_leave_the_state_of_the_calls_without_them(stub, steps):
    n = next(_clusters)
    with_repeats, once = f"prop-{n}-repeated", f"prop-{n}-once"
    # Every cluster starts with a plan, so DecideRestore has one to read.
    steps = [(("plan", 1), []), *steps]
    answers = []
    for k, (call, retries) in enumerate(steps):
        method, request = _request(once, k, call)
        getattr(stub, method)(request, timeout=TIMEOUT_S)
        method, request = _request(with_repeats, k, call)
        answers.append(getattr(stub, method)(request, timeout=TIMEOUT_S))
        for r in retries:
            j = r % (k + 1)
            method, request = _request(with_repeats, j, steps[j][0])
            again = getattr(stub, method)(request, timeout=TIMEOUT_S)
            assert again.replayed and as_original(again) == answers[j]
    assert state(stub, with_repeats) == state(stub, once)
