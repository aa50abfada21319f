"""ClusterService state survives the server: `planner serve --store FILE` is
killed with SIGKILL after answering, restarted on the same file, and the
cluster's plan and drop-trigger estimates are still there (a real
subprocess, as a user runs it), on a SQLite file and on PostgreSQL."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from planner.commands.serve import default_store_path
from planner.service.cluster_store import ClusterStore
from planner.service.server import PlannerServer, ServerConfig
from planner.v1 import cluster_pb2, cluster_pb2_grpc

PLANNER = Path(sys.executable).parent / "planner"
REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 60
GB = 10**9


class Serve:
    def __init__(self, store: str, tmp_path: Path) -> None:
        self.stderr = (tmp_path / "serve.stderr").open("a", encoding="utf-8")
        self.proc = subprocess.Popen(
            [str(PLANNER), "serve", "--port", "0", "--store", store],
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline().strip()
        match = re.fullmatch(r"planner serving on (127\.0\.0\.1:\d+)", first)
        assert match, f"unexpected first line {first!r}"
        self.address = match.group(1)

    def stub(self) -> tuple[grpc.Channel, cluster_pb2_grpc.ClusterServiceStub]:
        ch = grpc.insecure_channel(self.address)
        grpc.channel_ready_future(ch).result(timeout=TIMEOUT_S)
        return ch, cluster_pb2_grpc.ClusterServiceStub(ch)

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(timeout=TIMEOUT_S) == -signal.SIGKILL

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=TIMEOUT_S)
        self.stderr.close()


@pytest.fixture
def servers(tmp_path) -> Iterator[list[Serve]]:
    started: list[Serve] = []
    yield started
    for s in started:
        s.close()


def test_cluster_state_survives_kill_9(tmp_path, servers, store_location):
    # A SQLite file in a folder that does not exist yet, or a database.
    store = (
        store_location
        if store_location.startswith("postgresql://")
        else str(tmp_path / "state" / "planner.sqlite3")
    )
    first = Serve(store, tmp_path)
    servers.append(first)
    ch, stub = first.stub()
    with ch:
        plan = stub.PlanBuddyGroups(
            cluster_pb2.PlanBuddyGroupsRequest(
                cluster_id="prod",
                instances=[
                    cluster_pb2.ClusterInstance(
                        id=f"gpu{j}", kv_capacity_bytes=40 * GB, kv_demand_bytes=d * GB
                    )
                    for j, d in enumerate([70, 10, 60, 20])
                ],
                param_bytes=28 * GB,
                num_layers=48,
                group_throughput=[1.0, 1.8, 2.5, 3.1],
            ),
            timeout=TIMEOUT_S,
        ).plan
        assert plan.merges == 2

        def observe(stub_, now_s: float, kv_gb: int) -> cluster_pb2.EvaluateDropTriggerResponse:
            return stub_.EvaluateDropTrigger(
                cluster_pb2.EvaluateDropTriggerRequest(
                    cluster_id="prod",
                    now_s=now_s,
                    instances=[
                        cluster_pb2.InstanceMemory(
                            instance_id="gpu0",
                            kv_used_bytes=kv_gb * GB,
                            hbm_available_bytes=100 * GB,
                        )
                    ],
                ),
                timeout=TIMEOUT_S,
            )

        observe(stub, 1.0, 40)
        assert observe(stub, 2.0, 50).revision == 3  # 10 GB/s
    first.kill9()

    second = Serve(store, tmp_path)
    servers.append(second)
    ch, stub = second.stub()
    with ch:
        state = stub.GetClusterState(
            cluster_pb2.GetClusterStateRequest(cluster_id="prod"), timeout=TIMEOUT_S
        )
        assert state.found and state.revision == 3
        assert state.plan == plan
        (monitor,) = state.monitors
        assert monitor.instance_id == "gpu0" and monitor.last_now_s == 2.0
        assert monitor.kv_rate_bytes_per_s == pytest.approx(10 * GB)
        # The next observation continues from the stored one: +45 GB in 1 s
        # leaves 5 GB, so exhaustion is predicted in 1/9 s.
        after = observe(stub, 3.0, 95)
        assert after.drop
        assert after.instances[0].time_to_exhaustion_s == pytest.approx(5 / 45)
    second.proc.send_signal(signal.SIGTERM)
    assert second.proc.wait(timeout=TIMEOUT_S) == 0
    # What the second server wrote is on disk too.
    reader = ClusterStore(store)
    state_doc, revision = reader.read("prod")
    reader.close()
    assert revision == 4 and state_doc is not None
    assert state_doc["monitors"]["gpu0"]["last_now_s"] == 3.0


def test_an_unusable_store_stops_the_server_from_starting(tmp_path):
    """`planner serve` prints this OSError and exits 1."""
    blocker = tmp_path / "file"
    blocker.write_text("not a folder", encoding="utf-8")
    with pytest.raises(OSError, match="cannot open store"):
        PlannerServer(ServerConfig(port=0, store_path=str(blocker / "planner.sqlite3")))


def test_default_store_path(monkeypatch, tmp_path):
    monkeypatch.setenv("PLANNER_STORE", str(tmp_path / "x.sqlite3"))
    assert default_store_path() == str(tmp_path / "x.sqlite3")
    monkeypatch.delenv("PLANNER_STORE")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert default_store_path() == str(tmp_path / "planner" / "planner.sqlite3")


def test_store_rolls_back_a_failed_change(tmp_path):
    store = ClusterStore(tmp_path / "s.sqlite3")
    store.update("c", lambda s: ({"n": 1}, None))

    def boom(state):
        state["n"] = 2
        raise ValueError("no")

    with pytest.raises(ValueError):
        store.update("c", boom)
    assert store.read("c") == ({"n": 1}, 1)
    store.close()
    memory = ClusterStore()
    assert not memory.durable
    assert memory.read("c") == (None, 0)
