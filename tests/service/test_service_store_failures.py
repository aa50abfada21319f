"""When the durable store cannot be written, store-backed calls answer
UNAVAILABLE with the reason and change nothing, PlacementService and
ClusterService report NOT_SERVING (the rest of the server keeps serving),
and both turn SERVING again once a write succeeds, without a call. A store
file that is corrupt, empty or from a newer planner stops `planner serve`
with one line naming it.

Two real failures: SQLite's own "database or disk is full" (its page limit
lowered on the server's connection, in process) and a real `planner serve`
whose file-size limit is cut to 0 with prlimit, so every write of the store
file fails in the kernel (EFBIG, an I/O error to SQLite)."""

from __future__ import annotations

import queue
import re
import resource
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from planner.service.cluster_store import ClusterStore
from planner.service.placement_ledger import offer_memory_rpc
from planner.service.server import PlannerServer, ServerConfig
from planner.v1 import info_pb2, info_pb2_grpc, placement_pb2, placement_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[2]
PLACEMENT = "planner.v1.PlacementService"
CLUSTER = "planner.v1.ClusterService"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
TIMEOUT_S = 30


class HealthWatch:
    """The statuses a Watch stream on one service delivers, in order."""

    def __init__(self, channel: grpc.Channel, service: str) -> None:
        self.statuses: queue.Queue[int] = queue.Queue()
        stub = health_pb2_grpc.HealthStub(channel)
        self._stream = stub.Watch(health_pb2.HealthCheckRequest(service=service), timeout=120)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for response in self._stream:
                self.statuses.put(response.status)
        except grpc.RpcError:
            pass

    def next(self) -> int:
        return self.statuses.get(timeout=TIMEOUT_S)

    def close(self) -> None:
        self._stream.cancel()


def offer(key: str, producer: str = "g") -> placement_pb2.OfferMemoryRequest:
    return placement_pb2.OfferMemoryRequest(
        pool_id="pool", idempotency_key=key, producer_id=producer, bytes=1 << 20
    )


def check(channel: grpc.Channel, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT_S).status


def assert_other_services_serve(channel: grpc.Channel) -> None:
    assert check(channel, "") == SERVING
    assert check(channel, "planner.v1.RotationService") == SERVING
    info = info_pb2_grpc.PlannerInfoServiceStub(channel)
    assert info.GetPlannerInfo(info_pb2.GetPlannerInfoRequest(), timeout=TIMEOUT_S).version


def test_a_full_disk_answers_unavailable_and_turns_health_not_serving(tmp_path: Path) -> None:
    server = PlannerServer(ServerConfig(port=0, store_path=str(tmp_path / "s.sqlite3")))
    server.start()
    channel = grpc.insecure_channel(server.address)
    watch = HealthWatch(channel, PLACEMENT)
    try:
        ledger = placement_pb2_grpc.PlacementServiceStub(channel)
        assert watch.next() == SERVING
        assert ledger.OfferMemory(offer("first"), timeout=TIMEOUT_S).revision == 1
        conn = server.cluster_store.db.connect()
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")
        # Each call adds rows; the first that needs a new page fails.
        failed = None
        for k in range(2_000):
            try:
                ledger.OfferMemory(offer(f"fill{k}"), timeout=TIMEOUT_S)
            except grpc.RpcError as exc:
                failed = (k, exc)
                break
        assert failed is not None, "the store never filled up"
        k, exc = failed
        assert exc.code() == grpc.StatusCode.UNAVAILABLE
        assert exc.details() == "store unavailable: database or disk is full"
        assert watch.next() == NOT_SERVING
        assert check(channel, CLUSTER) == NOT_SERVING
        assert_other_services_serve(channel)
        status = ledger.GetPoolStatus(
            placement_pb2.GetPoolStatusRequest(pool_id="pool"), timeout=TIMEOUT_S
        )
        assert status.revision == k + 1  # the failed call changed nothing

        conn.execute("PRAGMA max_page_count = 1073741823")
        # The probe writes without any call and turns the health back.
        assert watch.next() == SERVING
        assert check(channel, CLUSTER) == SERVING
        again = ledger.OfferMemory(offer(f"fill{k}"), timeout=TIMEOUT_S)
        assert not again.replayed and again.revision == k + 2
    finally:
        watch.close()
        channel.close()
        server.stop(grace_s=1.0)


def _serve(store: Path, stderr: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "planner.cli", "serve", "--port", "0", "--store", str(store)],
        stdout=subprocess.PIPE,
        stderr=stderr.open("ab"),
        text=True,
        cwd=REPO_ROOT,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline().strip()
    match = re.fullmatch(r"planner serving on (127\.0\.0\.1:\d+)", first)
    assert match, f"unexpected first line {first!r}: {stderr.read_text()}"
    return proc, match.group(1)


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=TIMEOUT_S)


@pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="needs prlimit (Linux)")
def test_failing_writes_of_a_real_server_answer_unavailable_until_they_succeed(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    store = tmp_path / "s.sqlite3"
    proc, address = _serve(store, tmp_path / "serve.log")
    processes.append(proc)
    channel = grpc.insecure_channel(address)
    watch = HealthWatch(channel, PLACEMENT)
    try:
        ledger = placement_pb2_grpc.PlacementServiceStub(channel)
        assert watch.next() == SERVING
        assert ledger.OfferMemory(offer("a"), timeout=TIMEOUT_S).revision == 1
        limits = resource.prlimit(proc.pid, resource.RLIMIT_FSIZE)
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (0, limits[1]))
        with pytest.raises(grpc.RpcError) as refused:
            ledger.OfferMemory(offer("b"), timeout=TIMEOUT_S)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert refused.value.details() == "store unavailable: disk I/O error"
        assert watch.next() == NOT_SERVING
        assert_other_services_serve(channel)
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, limits)
        assert watch.next() == SERVING
        assert ledger.OfferMemory(offer("b"), timeout=TIMEOUT_S).revision == 2
    finally:
        watch.close()
        channel.close()
    proc.kill()
    proc.wait(timeout=TIMEOUT_S)
    reopened = ClusterStore(store)
    ledger_rows, revision = reopened.ledger.read("pool")
    assert revision == 2 and ledger_rows is not None
    assert ledger_rows.producers["g"].offered_bytes == 2 << 20
    reopened.close()


def _start_refused(store: Path) -> subprocess.CompletedProcess[str]:
    # A server that started anyway would run until the timeout.
    return subprocess.run(
        [sys.executable, "-m", "planner.cli", "serve", "--port", "0", "--store", str(store)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
        check=False,
    )


def _store_with_data(path: Path) -> None:
    store = ClusterStore(path)
    for k in range(300):
        offer_memory_rpc(offer(f"k{k}", producer=f"p{k}"), store.ledger)
    store.close()  # checkpoints: everything is in the main file


def test_a_corrupt_store_is_refused_at_start(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    _store_with_data(path)
    data = bytearray(path.read_bytes())
    page = 4096
    assert len(data) > 8 * page
    # Every page but the first (the schema) overwritten.
    data[page:] = b"\xab" * (len(data) - page)
    path.write_bytes(bytes(data))
    done = _start_refused(path)
    assert done.returncode == 1, done.stdout
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"planner serve: cannot open store {path}: {path} is corrupt (")
    assert "restore it from a backup" in line

    path.write_bytes(b"this is not a database, just some text" * 200)
    done = _start_refused(path)
    assert done.returncode == 1
    assert f"{path} is corrupt (file is not a database)" in done.stderr


def test_an_empty_store_file_is_refused_and_a_new_one_is_never_empty(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    path.touch()
    done = _start_refused(path)
    assert done.returncode == 1
    assert f"{path} is empty (0 bytes), so it is not a planner store" in done.stderr
    assert "Traceback" not in done.stderr
    # A missing file is a new store, created whole before the server uses it.
    fresh = tmp_path / "new" / "s.sqlite3"
    store = ClusterStore(fresh)
    store.open()
    assert fresh.stat().st_size > 0
    assert [p.name for p in fresh.parent.iterdir() if p.name.startswith(".")] == []
    store.close()


def test_a_store_from_a_newer_planner_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    _store_with_data(path)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    done = _start_refused(path)
    assert done.returncode == 1
    assert "written by a newer planner (schema 99" in done.stderr
