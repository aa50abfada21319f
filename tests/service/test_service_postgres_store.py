"""The PostgreSQL store against a real server (tests/conftest.py):

- an unreachable server, a wrong password or a missing database stops
  `planner serve` with one line naming the URL without its password;
- the planner creates and versions its schema (planner_schema), once
  however many replicas start together, and refuses a newer one;
- a transaction PostgreSQL cannot serialize is run again, and both changes
  land;
- the same idempotency key sent to two replicas, one after the other or at
  the same moment, applies once and answers the same everywhere;
- the server going away answers UNAVAILABLE naming the store, turns
  PlacementService and ClusterService NOT_SERVING, and they serve again
  when it is back, without a call;
- ids with NUL characters (valid protobuf strings) round trip."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2
from test_service_store_failures import HealthWatch, assert_other_services_serve, check, offer

from planner.bench.postgres_server import (
    PASSWORD,
    LocalPostgres,
    PostgresUnavailableError,
    free_port,
)
from planner.client import PlannerClient
from planner.service.cluster_store import ClusterStore
from planner.service.errors import StoreUnavailableError
from planner.service.postgres_database import PostgresDatabase
from planner.service.postgres_schema import LATEST_VERSION
from planner.service.server import PlannerServer, ServerConfig
from planner.service.store_location import is_postgresql_url, without_password
from planner.v1 import cluster_pb2, placement_pb2, placement_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[2]
PLACEMENT = "planner.v1.PlacementService"
CLUSTER = "planner.v1.ClusterService"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
TIMEOUT_S = 60
SECRET = "s3cret-Pa55"


def serve_fails(store: str) -> str:
    """`planner serve --store STORE`: exit 1 and one line; the line."""
    done = subprocess.run(
        [sys.executable, "-m", "planner.cli", "serve", "--port", "0", "--store", store],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_an_unreachable_server_is_named_without_its_password():
    url = f"postgresql://planner:{SECRET}@127.0.0.1:{free_port()}/planner"
    line = serve_fails(url)
    assert line.startswith(f"planner serve: cannot open store {without_password(url)}: "), line
    assert "postgresql://planner:***@127.0.0.1:" in line
    assert SECRET not in line
    assert "refused" in line.lower()


def open_fails(url: str) -> str:
    """What `planner serve` prints after "planner serve: " (PlannerServer's
    OSError), in process."""
    with pytest.raises(OSError) as refused:
        PlannerServer(ServerConfig(port=0, store_path=url))
    return str(refused.value)


def test_a_wrong_password_and_a_missing_database_are_named(postgresql):
    wrong = postgresql.url("postgres", password=SECRET)
    message = open_fails(wrong)
    assert message.startswith(f"cannot open store {without_password(wrong)}: ")
    assert "password authentication failed" in message and SECRET not in message
    missing = postgresql.url("no_such_database")
    message = open_fails(missing)
    assert 'database "no_such_database" does not exist' in message
    assert PASSWORD not in message


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:pw@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgres://u@h/db", "postgres://u@h/db"),
        (
            "postgresql://u:p%40w@[::1]:1/db?sslmode=require",
            "postgresql://u:***@[::1]:1/db?sslmode=require",
        ),
        ("postgresql://h/db?user=u&password=pw", "postgresql://h/db?user=u&password=***"),
        ("postgresql://u:pw@h:notaport/db", "postgresql://***"),
    ],
)
def test_urls_are_shown_without_their_password(url, shown):
    assert is_postgresql_url(url)
    assert without_password(url) == shown


def test_sqlite_paths_are_not_urls():
    for path in ("planner.sqlite3", "/var/lib/postgresql.sqlite3", ":memory:", "x://y"):
        assert not is_postgresql_url(path)


def schema_rows(url: str) -> list[tuple[int, str]]:
    with psycopg.connect(url) as conn:
        return [
            (int(v), str(d))
            for v, d in conn.execute(
                "SELECT version, description FROM planner_schema ORDER BY version"
            ).fetchall()
        ]


def test_replicas_starting_together_create_the_schema_once(postgresql_url):
    stores = [ClusterStore(postgresql_url, pool_size=1) for _ in range(4)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(stores))

    def open_store(store: ClusterStore) -> None:
        try:
            start.wait(TIMEOUT_S)
            store.open()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_store, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    assert errors == []
    assert [v for v, _ in schema_rows(postgresql_url)] == list(range(1, LATEST_VERSION + 1))
    for s in stores:
        s.close()


def test_a_newer_schema_is_refused(postgresql_url):
    ClusterStore(postgresql_url).open()
    with psycopg.connect(postgresql_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO planner_schema (version, description) VALUES (%s, 'from the future')",
            (LATEST_VERSION + 1,),
        )
    message = open_fails(postgresql_url)
    assert f"written by a newer planner (schema {LATEST_VERSION + 1}" in message


def test_a_transaction_that_cannot_be_serialized_runs_again(postgresql_url):
    """Two transactions read a row, then both write it: PostgreSQL rolls one
    back, the store runs it again, and both increments land."""
    db = PostgresDatabase(postgresql_url, pool_size=2)
    db.open()
    db.run(lambda c: c.execute("INSERT INTO store_probe (id, writes) VALUES (7, 0)"))
    both_read = threading.Barrier(2)
    attempts = [0, 0]

    def increment(k: int) -> None:
        def work(conn: psycopg.Connection) -> None:
            attempts[k] += 1
            (writes,) = conn.execute("SELECT writes FROM store_probe WHERE id = 7").fetchone()
            if attempts[k] == 1:
                both_read.wait(TIMEOUT_S)
            conn.execute("UPDATE store_probe SET writes = %s WHERE id = 7", (writes + 1,))

        db.run(work)

    threads = [threading.Thread(target=increment, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    final = db.run(
        lambda c: c.execute("SELECT writes FROM store_probe WHERE id = 7").fetchone()[0],
        read_only=True,
    )
    assert final == 2
    assert sorted(attempts) == [1, 2] and db.retries == 1
    db.close()


@pytest.fixture
def two_replicas(postgresql_url) -> Iterator[list[PlannerServer]]:
    servers = [
        PlannerServer(ServerConfig(host="127.0.0.1", port=0, store_path=postgresql_url))
        for _ in range(2)
    ]
    for s in servers:
        s.start()
    yield servers
    for s in servers:
        s.stop(grace_s=1.0)


def test_a_key_answered_by_one_replica_is_replayed_by_the_other(two_replicas):
    a, b = (PlannerClient(s.address, deadline_s=TIMEOUT_S) for s in two_replicas)
    with a, b:
        first = a.call("PlacementService.OfferMemory", offer("k1"))
        again = b.call("PlacementService.OfferMemory", offer("k1"))
        assert again.replayed and again.revision == first.revision == 1
        other = cluster_pb2.EvaluateDropTriggerRequest(
            cluster_id="c",
            idempotency_key="o1",
            now_s=1.0,
            instances=[
                cluster_pb2.InstanceMemory(instance_id="i", kv_used_bytes=1, hbm_available_bytes=2)
            ],
        )
        answered = b.call("ClusterService.EvaluateDropTrigger", other)
        replayed = a.call("ClusterService.EvaluateDropTrigger", other)
        assert replayed.replayed and replayed.revision == answered.revision == 1
        reused = offer("k1", producer="someone-else")
        with pytest.raises(Exception, match="idempotency_key"):
            b.call("PlacementService.OfferMemory", reused)


def test_the_same_key_sent_to_both_replicas_at_once_applies_once(two_replicas):
    clients = [PlannerClient(s.address, deadline_s=TIMEOUT_S) for s in two_replicas]
    senders = 8
    start = threading.Barrier(senders)
    answers: list[placement_pb2.OfferMemoryResponse] = []
    errors: list[BaseException] = []

    def send(k: int) -> None:
        try:
            start.wait(TIMEOUT_S)
            answers.append(clients[k % 2].call("PlacementService.OfferMemory", offer("same")))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(k,)) for k in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    assert errors == []
    assert sorted(a.replayed for a in answers) == [False] + [True] * (senders - 1)
    assert {a.revision for a in answers} == {1}
    status = clients[0].call(
        "PlacementService.GetPoolStatus", placement_pb2.GetPoolStatusRequest(pool_id="pool")
    )
    assert status.revision == 1 and status.producers[0].offered_bytes == 1 << 20
    for c in clients:
        c.close()


@pytest.fixture(scope="module")
def own_postgresql() -> Iterator[LocalPostgres]:
    """A server of this module's own, to stop and start again."""
    try:
        pg = LocalPostgres()
    except PostgresUnavailableError as exc:
        pytest.skip(f"no PostgreSQL server for this test: {exc}")
    yield pg
    pg.stop()


def test_connections_the_server_dropped_are_replaced_without_an_error(own_postgresql):
    """After a restart of PostgreSQL every pooled connection is dead; the
    first statement finds out, before anything could commit, and the
    transaction runs again on a new connection."""
    pg = own_postgresql
    db = PostgresDatabase(pg.create_database(), pool_size=3)
    db.open()
    together = threading.Barrier(3)

    def hold(conn: psycopg.Connection) -> None:
        together.wait(TIMEOUT_S)

    threads = [threading.Thread(target=db.run, args=(hold,)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    pg.pause()
    pg.resume()
    db.probe()
    assert db.reconnects >= 1
    db.close()


def test_a_database_turned_read_only_is_unavailable_until_it_is_writable(postgresql_url):
    """As after a failover that left the planner on a demoted primary."""
    db = PostgresDatabase(postgresql_url, pool_size=2)
    db.open()
    db.probe()

    def turn(read_only: bool) -> None:
        base, name = postgresql_url.rsplit("/", 1)
        with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
            setting = "on" if read_only else "off"
            conn.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = {setting}')
            # Sessions read the setting when they start: end the pooled
            # ones (waiting until each has ended).
            conn.execute(
                "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )

    turn(read_only=True)
    with pytest.raises(StoreUnavailableError, match="read-only transaction"):
        db.probe()
    turn(read_only=False)
    db.probe()
    db.close()


def test_the_server_going_away_turns_health_not_serving_until_it_is_back(own_postgresql):
    pg = own_postgresql
    url = pg.create_database()
    server = PlannerServer(ServerConfig(port=0, store_path=url))
    server.start()
    channel = grpc.insecure_channel(server.address)
    watch = HealthWatch(channel, PLACEMENT)
    try:
        ledger = placement_pb2_grpc.PlacementServiceStub(channel)
        assert watch.next() == SERVING
        assert ledger.OfferMemory(offer("first"), timeout=TIMEOUT_S).revision == 1
        pg.pause()
        with pytest.raises(grpc.RpcError) as failed:
            ledger.OfferMemory(offer("second"), timeout=TIMEOUT_S)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        detail = failed.value.details()
        assert detail.startswith(f"store unavailable: {without_password(url)}: "), detail
        assert "***" in detail and PASSWORD not in detail
        assert watch.next() == NOT_SERVING
        assert check(channel, CLUSTER) == NOT_SERVING
        assert_other_services_serve(channel)
        pg.resume()
        # The probe reconnects and writes, without any call.
        assert watch.next() == SERVING
        again = ledger.OfferMemory(offer("second"), timeout=TIMEOUT_S)
        assert not again.replayed and again.revision == 2
    finally:
        watch.close()
        channel.close()
        server.stop(grace_s=1.0)


def test_ids_with_nul_characters_round_trip(postgresql_url):
    server = PlannerServer(ServerConfig(port=0, store_path=postgresql_url))
    server.start()
    try:
        with PlannerClient(server.address, deadline_s=TIMEOUT_S) as client:
            request = placement_pb2.OfferMemoryRequest(
                pool_id="p\0ol", idempotency_key="k\0", producer_id="g\0\u00e9", bytes=5
            )
            client.call("PlacementService.OfferMemory", request)
            assert client.call("PlacementService.OfferMemory", request).replayed
            status = client.call(
                "PlacementService.GetPoolStatus",
                placement_pb2.GetPoolStatusRequest(pool_id="p\0ol"),
            )
            assert [p.producer_id for p in status.producers] == ["g\0\u00e9"]
    finally:
        server.stop(grace_s=1.0)
