"""kill -9 of `planner serve --store FILE --port P` in the middle of a burst
that mixes lease-ledger mutations (PlacementService, idempotency keys) and
cluster-state mutations (ClusterService, one JSON document per cluster),
then a restart on the same file and port.

- Cluster clients send every call with an idempotency key and the same
  RetryPolicy: the call in flight at the kill is retried once the server is
  back, and applies once whether or not the killed server committed it
  (then its retry is answered replayed = true). Each cluster's revision
  counts every call exactly once, and its plan and drop-trigger estimates
  equal a pure InstanceMonitor fed each observation once; every
  acknowledged call, re-sent after the restart, replays its original answer.
- Ledger clients are PlannerClients with a RetryPolicy that waits for the
  server (wait_for_ready) and a deadline spanning the restart: they carry on
  through it without an error, every acknowledged call replays with its
  original answer, and each producer's accounts equal a pure Ledger that ran
  the sequence once (idempotency keys absorb the retried call).
- A call issued while the server is down succeeds once it is back, once.

The ledger sequences are those of test_service_placement_restart. Run on
a SQLite file and on a PostgreSQL database; test_service_replicas runs the
same clients against several replicas sharing one PostgreSQL."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from test_service_placement_restart import POOL, expected, request, sequence

from planner.client import PlannerClient, PlannerError, RetryPolicy
from planner.policies.buddy.controller import InstanceMonitor, TriggerConfig
from planner.v1 import cluster_pb2
from planner.v1 import placement_pb2 as pb

PLANNER = Path(sys.executable).parent / "planner"
REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 60
GB = 10**9
LEDGER_CLIENTS = 2
CLUSTER_CLIENTS = 2
OBSERVATIONS = 80
# Kill once every client has this many answers: all are mid-burst.
KILL_AFTER_EACH = 4
# ...and no client goes past this many answers before the kill.
HOLD_AT = 20
EWMA = 0.5
# Waits for the restarted server instead of failing while it is down.
ACROSS_RESTART = RetryPolicy(max_attempts=5, wait_for_ready=True)
# A client thread that fails an assertion fails the test.
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def serve(store: str, port: int, log: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [str(PLANNER), "serve", "--port", str(port), "--store", store, "--log-level", "error"],
        stdout=subprocess.PIPE,
        stderr=log.open("a", encoding="utf-8"),
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    first = proc.stdout.readline().strip()
    assert re.fullmatch(rf"planner serving on 127\.0\.0\.1:{port}", first), first
    return proc


class Progress:
    """Answers counted per client; the test waits on it, not on the clock.
    A client that reaches HOLD_AT answers before the kill waits for it there,
    so that a fast client cannot finish before a slow one is under way."""

    def __init__(self, clients: int) -> None:
        self.acked = [0] * clients
        self.changed = threading.Condition()
        self.killed = threading.Event()

    def ack(self, client: int) -> None:
        with self.changed:
            self.acked[client] += 1
            self.changed.notify_all()
            held = self.acked[client] == HOLD_AT
        if held:
            self.killed.wait(TIMEOUT_S)

    def wait_for_each(self, n: int, done: list[threading.Thread]) -> None:
        with self.changed:
            assert self.changed.wait_for(
                lambda: min(self.acked) >= n or not all(t.is_alive() for t in done),
                timeout=TIMEOUT_S,
            )


@dataclass
class LedgerClient:
    c: int
    acked: list[tuple[Any, Any]] = field(default_factory=list)  # (request, answer)
    error: BaseException | None = None

    def run(self, address: str, progress: Progress) -> None:
        leases: dict[int, str] = {}
        allocs = 0
        try:
            with PlannerClient(address, deadline_s=TIMEOUT_S, retry=ACROSS_RESTART) as client:
                for k, (method, args) in enumerate(sequence(self.c)):
                    req = request(self.c, k, method, args, leases)
                    try:
                        out = client.call(f"PlacementService.{method}", req)
                    except PlannerError as exc:
                        if exc.code.name != "FAILED_PRECONDITION":  # freeing no lease
                            raise
                        out = None
                    if method == "AllocateMemory":
                        if out is not None and out.granted:
                            leases[allocs] = out.lease.lease_id
                        allocs += 1
                    if out is not None:
                        self.acked.append((req, out))
                    progress.ack(self.c)
        except BaseException as exc:
            self.error = exc


def plan_request(cluster: str) -> cluster_pb2.PlanBuddyGroupsRequest:
    return cluster_pb2.PlanBuddyGroupsRequest(
        cluster_id=cluster,
        instances=[
            cluster_pb2.ClusterInstance(
                id=f"gpu{j}", kv_capacity_bytes=40 * GB, kv_demand_bytes=d * GB
            )
            for j, d in enumerate([70, 10, 60, 20])
        ],
        param_bytes=28 * GB,
        num_layers=48,
        group_throughput=[1.0, 1.8, 2.5, 3.1],
        idempotency_key="plan",
    )


def observation(k: int) -> list[tuple[str, int, int]]:
    """(instance, KV used, HBM available) of the k-th observation (1-based)."""
    return [
        ("gpu0", (30 + 7 * k % 13) * GB, (100 - k % 5) * GB),
        ("gpu2", (20 + 11 * k % 17) * GB, (90 - k % 3) * GB),
    ]


def observe_request(cluster: str, k: int) -> cluster_pb2.EvaluateDropTriggerRequest:
    return cluster_pb2.EvaluateDropTriggerRequest(
        cluster_id=cluster,
        idempotency_key=f"observe-{k}",
        now_s=float(k),
        instances=[
            cluster_pb2.InstanceMemory(instance_id=i, kv_used_bytes=kv, hbm_available_bytes=hbm)
            for i, kv, hbm in observation(k)
        ],
        params=cluster_pb2.TriggerParams(ewma_weight=EWMA),
    )


def pure_monitors(observations: int) -> dict[str, InstanceMonitor]:
    config = TriggerConfig(ewma_weight=EWMA)
    monitors = {i: InstanceMonitor(i) for i, _, _ in observation(1)}
    for k in range(1, observations + 1):
        for i, kv, hbm in observation(k):
            monitors[i].observe(float(k), float(kv), float(hbm), config)
    return monitors


@dataclass
class ClusterClient:
    cluster: str
    observations: int = OBSERVATIONS
    acked: list[tuple[str, Any, Any]] = field(default_factory=list)  # (method, request, answer)
    error: BaseException | None = None

    def calls(self) -> list[tuple[str, Any]]:
        """The plan, then observations 1, 2, ...: revision k + 1 is call k."""
        return [("PlanBuddyGroups", plan_request(self.cluster))] + [
            ("EvaluateDropTrigger", observe_request(self.cluster, k))
            for k in range(1, self.observations + 1)
        ]

    def run(self, address: str, progress: Progress, slot: int) -> None:
        try:
            with PlannerClient(address, deadline_s=TIMEOUT_S, retry=ACROSS_RESTART) as client:
                for k, (method, req) in enumerate(self.calls()):
                    answer = client.call(f"ClusterService.{method}", req)
                    # Applied once: a retry the first server had committed
                    # answers with that call's revision.
                    assert answer.revision == k + 1, (k, answer.revision)
                    self.acked.append((method, req, answer))
                    progress.ack(slot)
        except BaseException as exc:
            self.error = exc


def test_kill_9_mid_mixed_burst_then_restart(tmp_path, store_location):
    store = store_location
    log = tmp_path / "serve.log"
    port = free_port()
    address = f"127.0.0.1:{port}"
    proc = serve(store, port, log)
    ledgers = [LedgerClient(c) for c in range(LEDGER_CLIENTS)]
    clusters = [ClusterClient(f"cluster{j}") for j in range(CLUSTER_CLIENTS)]
    progress = Progress(LEDGER_CLIENTS + CLUSTER_CLIENTS)
    threads = [threading.Thread(target=cl.run, args=(address, progress)) for cl in ledgers]
    threads += [
        threading.Thread(target=cl.run, args=(address, progress, LEDGER_CLIENTS + j))
        for j, cl in enumerate(clusters)
    ]
    late_answer: list[Any] = []
    try:
        for t in threads:
            t.start()
        progress.wait_for_each(KILL_AFTER_EACH, threads)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=TIMEOUT_S) == -signal.SIGKILL
        at_kill = list(progress.acked)
        progress.killed.set()
        ledger_lengths = [len(sequence(c)) for c in range(LEDGER_CLIENTS)]
        cluster_lengths = [len(cl.calls()) for cl in clusters]
        assert all(
            n < total for n, total in zip(at_kill, ledger_lengths + cluster_lengths, strict=True)
        ), f"killed too late: {at_kill}"

        # A call made while the server is down: it waits for the restart.
        issued = threading.Event()

        def late_offer() -> None:
            with PlannerClient(address, deadline_s=TIMEOUT_S, retry=ACROSS_RESTART) as client:
                issued.set()
                late_answer.append(client.call("PlacementService.OfferMemory", late_request()))

        late = threading.Thread(target=late_offer)
        late.start()
        assert issued.wait(TIMEOUT_S)
        proc = serve(store, port, log)
        late.join(TIMEOUT_S)
        for t in threads:
            t.join(TIMEOUT_S)
        assert not any(t.is_alive() for t in [late, *threads])

        with PlannerClient(address, deadline_s=TIMEOUT_S) as client:
            check_clusters(client, clusters)
            check_ledgers(client, ledgers)
            (answer,) = late_answer
            assert not answer.replayed and answer.producer.offered_bytes == 3 * GB
            again = client.call("PlacementService.OfferMemory", late_request())
            assert again.replayed and again.revision == answer.revision
            status = client.call(
                "PlacementService.GetPoolStatus", pb.GetPoolStatusRequest(pool_id=POOL)
            )
            (late_producer,) = [p for p in status.producers if p.producer_id == "late"]
            assert late_producer.offered_bytes == 3 * GB
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=TIMEOUT_S)


def late_request() -> pb.OfferMemoryRequest:
    return pb.OfferMemoryRequest(
        pool_id=POOL, idempotency_key="late-1", producer_id="late", bytes=3 * GB
    )


def check_clusters(client: PlannerClient, clusters: list[ClusterClient]) -> None:
    for cl in clusters:
        assert cl.error is None, repr(cl.error)
        assert len(cl.acked) == cl.observations + 1
        # At most the call in flight at the kill was committed unanswered.
        assert sum(answer.replayed for _, _, answer in cl.acked) <= 1
        # A client that lost any answer retries: the original comes back.
        for method, req, out in cl.acked:
            again = client.call(f"ClusterService.{method}", req)
            assert again.replayed
            again.replayed = False
            out.replayed = False
            assert again == out
        state = client.call(
            "ClusterService.GetClusterState",
            cluster_pb2.GetClusterStateRequest(cluster_id=cl.cluster),
        )
        # Every call applied exactly once.
        assert state.revision == cl.observations + 1
        assert state.plan == cl.acked[0][2].plan
        want = pure_monitors(cl.observations)
        got = {m.instance_id: m for m in state.monitors}
        assert set(got) == set(want)
        for i, m in want.items():
            assert (
                got[i].last_now_s,
                got[i].last_kv_used_bytes,
                got[i].last_hbm_available_bytes,
                got[i].kv_rate_bytes_per_s,
                got[i].hbm_rate_bytes_per_s,
            ) == (
                m.last_now_s,
                m.last_kv_used_bytes,
                m.last_hbm_available_bytes,
                m.kv_rate_bytes_per_s,
                m.hbm_rate_bytes_per_s,
            )


def check_ledgers(client: PlannerClient, ledgers: list[LedgerClient]) -> None:
    for cl in ledgers:
        assert cl.error is None, repr(cl.error)
        assert len(cl.acked) > 0
        for req, out in cl.acked:
            again = client.call(
                f"PlacementService.{type(req).__name__.removesuffix('Request')}", req
            )
            assert again.replayed
            again.replayed = False
            out.replayed = False
            assert again == out
    status = client.call("PlacementService.GetPoolStatus", pb.GetPoolStatusRequest(pool_id=POOL))
    by_id = {p.producer_id: p for p in status.producers}
    for cl in ledgers:
        want = expected(cl.c).producers[f"p{cl.c}"]
        got = by_id[f"p{cl.c}"]
        assert (got.offered_bytes, got.leased_bytes, got.returned_total_bytes) == (
            want.offered_bytes,
            want.leased_bytes,
            want.returned_total_bytes,
        )
        live = [x for x in status.leases if x.producer_id == f"p{cl.c}"]
        assert sum(x.bytes for x in live) == got.leased_bytes


def test_retry_policy_reconnect_backoff_bounds():
    with pytest.raises(ValueError, match="max_reconnect_backoff_s"):
        RetryPolicy(max_reconnect_backoff_s=0.05)
    assert RetryPolicy(max_reconnect_backoff_s=0.1).max_reconnect_backoff_s == 0.1
