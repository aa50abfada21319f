"""The lease ledger stored per row answers exactly like the pure Ledger that
holds the whole pool, reads and writes a number of rows that does not depend
on the pool's size, keeps a bounded number of idempotency records, and
converts a store written with one JSON document per pool."""

from __future__ import annotations

import itertools
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from stores import rows_of

import planner.policies.aqua.ledger as ledger_module
import planner.service.placement_ledger as placement_ledger
from planner.policies.aqua.ledger import Ledger, LedgerConflictError
from planner.service.cluster_store import ClusterStore
from planner.service.errors import FailedPreconditionError
from planner.service.ledger_sqlite import SqliteLedgerBackend
from planner.service.placement_ledger import (
    LedgerStore,
    allocate_memory_rpc,
    free_memory_rpc,
    get_pool_status_rpc,
    offer_memory_rpc,
    pool_status,
    reclaim_memory_rpc,
)
from planner.service.store import SqliteDatabase
from planner.v1 import placement_pb2 as pb

GB = 10**9
POOL = "pool"
SERVERS = {"p0": "s0", "p1": "s0", "p2": "s1", "p3": ""}
SIZES = st.integers(min_value=1, max_value=8).map(lambda k: k * GB // 2)
GRACE_S = 5.0


class StoreMatchesWholeLedger(RuleBasedStateMachine):
    """Random offers, allocations (by producer, by server, anywhere), frees
    and reclaims through the per-row store (in-memory SQLite, or PostgreSQL
    with a pool per example) and through a pure Ledger: every call succeeds
    or is refused in both, and the pool's status is identical after every
    step."""

    def __init__(self, open_store: Callable[[], ClusterStore] = ClusterStore) -> None:
        super().__init__()
        self.cluster_store = open_store()
        self.store = self.cluster_store.ledger
        self.pool = f"pool-{next(_pools)}"
        self.model = Ledger()
        self.revision = 0
        self.n = 0
        self.now = 0.0
        self.leases: list[str] = []
        self.freed: list[str] = []

    def _key(self) -> str:
        self.n += 1
        return f"k{self.n}"

    def _both(self, rpc, request, model_op):
        try:
            answer = rpc(request, self.store)
        except FailedPreconditionError:
            with pytest.raises(LedgerConflictError):
                model_op()
            return None
        model_op()
        self.revision += 1
        assert answer.revision == self.revision
        return answer

    @rule(p=st.sampled_from(sorted(SERVERS)), size=SIZES)
    def offer(self, p, size):
        request = pb.OfferMemoryRequest(
            pool_id=self.pool,
            idempotency_key=self._key(),
            producer_id=p,
            bytes=size,
            server_id=SERVERS[p],
        )
        self._both(offer_memory_rpc, request, lambda: self.model.offer(p, size, SERVERS[p]))

    @rule(
        size=SIZES,
        where=st.sampled_from(["any", "s0", "s1", "s9", "p0", "p2", "p3", "p9"]),
    )
    def allocate(self, size, where):
        self.now += 1
        producer = where if where.startswith("p") else ""
        server = where if where.startswith("s") else ""
        request = pb.AllocateMemoryRequest(
            pool_id=self.pool,
            idempotency_key=self._key(),
            consumer_id="c",
            bytes=size,
            now_s=self.now,
            producer_id=producer,
            server_id=server,
        )
        expected: list[object] = []

        def model_op():
            expected.append(self.model.allocate("c", size, self.now, producer, server))

        answer = self._both(allocate_memory_rpc, request, model_op)
        lease, reason = expected[0]
        assert answer.granted == (lease is not None)
        assert answer.reason == reason
        if lease is not None:
            assert (answer.lease.lease_id, answer.lease.producer_id) == (
                lease.lease_id,
                lease.producer_id,
            )
            self.leases.append(lease.lease_id)

    @precondition(lambda self: bool(self.leases))
    @rule(i=st.integers(min_value=0, max_value=100))
    def free(self, i):
        lease_id = self.leases.pop(i % len(self.leases))
        request = pb.FreeMemoryRequest(
            pool_id=self.pool, idempotency_key=self._key(), lease_id=lease_id
        )
        self._both(free_memory_rpc, request, lambda: self.model.free(lease_id))
        self.freed.append(lease_id)

    @precondition(lambda self: bool(self.freed))
    @rule(i=st.integers(min_value=0, max_value=100))
    def free_again(self, i):
        lease_id = self.freed[i % len(self.freed)]
        request = pb.FreeMemoryRequest(
            pool_id=self.pool, idempotency_key=self._key(), lease_id=lease_id
        )
        assert self._both(free_memory_rpc, request, lambda: self.model.free(lease_id)) is None

    @rule(
        p=st.sampled_from([*SERVERS, "p9"]),
        size=st.integers(min_value=0, max_value=12).map(lambda k: k * GB // 4),
    )
    def reclaim(self, p, size):
        self.now += 1
        now = self.now
        request = pb.ReclaimMemoryRequest(
            pool_id=self.pool,
            idempotency_key=self._key(),
            producer_id=p,
            bytes=size,
            now_s=now,
            grace_s=GRACE_S,
        )
        self._both(
            reclaim_memory_rpc, request, lambda: self.model.reclaim(p, size, now, now + GRACE_S)
        )

    @invariant()
    def same_status(self):
        ask = pb.GetPoolStatusRequest(pool_id=self.pool, now_s=self.now + GRACE_S / 2)
        stored = get_pool_status_rpc(ask, self.store)
        expected = pool_status(self.model if self.revision else None, self.revision, ask)
        assert stored == expected

    def teardown(self):
        self.cluster_store.close()


_pools = itertools.count()
MACHINE_SETTINGS = settings(
    max_examples=40,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
StoreMatchesWholeLedger.TestCase.settings = MACHINE_SETTINGS
TestStoreMatchesWholeLedger = StoreMatchesWholeLedger.TestCase


def test_postgresql_store_matches_whole_ledger(postgresql_url):
    run_state_machine_as_test(
        lambda: StoreMatchesWholeLedger(lambda: ClusterStore(postgresql_url, pool_size=2)),
        settings=MACHINE_SETTINGS,
    )


def test_completed_reclaims_are_pruned_like_the_ledger_does(monkeypatch, store_location):
    monkeypatch.setattr(ledger_module, "KEEP_COMPLETED_RECLAIMS", 2)
    monkeypatch.setattr(placement_ledger, "KEEP_COMPLETED_RECLAIMS", 2)
    opened = ClusterStore(store_location)
    store = opened.ledger
    model = Ledger()
    n = 0

    def call(rpc, request, op):
        nonlocal n
        n += 1
        request.idempotency_key = f"k{n}"
        rpc(request, store)
        op()

    call(
        offer_memory_rpc,
        pb.OfferMemoryRequest(pool_id=POOL, producer_id="p", bytes=10 * GB),
        lambda: model.offer("p", 10 * GB),
    )
    for i in range(5):
        call(
            reclaim_memory_rpc,
            pb.ReclaimMemoryRequest(pool_id=POOL, producer_id="p", bytes=GB, now_s=i, grace_s=1),
            lambda i=i: model.reclaim("p", GB, i, i + 1),
        )
    ask = pb.GetPoolStatusRequest(pool_id=POOL)
    stored = get_pool_status_rpc(ask, store)
    assert [r.reclaim_id for r in stored.reclaims] == ["reclaim-4", "reclaim-5"]
    assert stored == pool_status(model, n, ask)
    assert rows_of(opened, "SELECT reclaim_id FROM ledger_reclaim ORDER BY seq") == [
        ("reclaim-4",),
        ("reclaim-5",),
    ]
    opened.close()


def test_idempotency_records_are_bounded_per_pool(store_location):
    opened = ClusterStore(store_location)
    store = LedgerStore(opened.ledger.backend, keep_keyed_calls=3)

    def offer(key: str, pool: str = POOL) -> pb.OfferMemoryResponse:
        request = pb.OfferMemoryRequest(pool_id=pool, idempotency_key=key, producer_id="p", bytes=1)
        return offer_memory_rpc(request, store)

    for k in range(1, 6):
        assert not offer(f"k{k}").replayed
    assert offer("other", pool="quiet").revision == 1
    rows = rows_of(
        opened, "SELECT pool_id, idempotency_key FROM ledger_request ORDER BY pool_id, revision"
    )
    assert rows == [("pool", "k3"), ("pool", "k4"), ("pool", "k5"), ("quiet", "other")]
    assert offer("k5").replayed and offer("k3").replayed
    # k1's record is gone: the same request applies again, as a new call.
    again = offer("k1")
    assert not again.replayed and again.revision == 6
    assert offer("other", pool="quiet").replayed
    opened.close()


def _statements_of_one_offer(producers: int) -> list[str]:
    db = SqliteDatabase()
    store = LedgerStore(SqliteLedgerBackend(db))
    for i in range(producers):
        offer_memory_rpc(
            pb.OfferMemoryRequest(
                pool_id=POOL, idempotency_key=f"seed{i}", producer_id=f"p{i:05d}", bytes=GB
            ),
            store,
        )
    seen: list[str] = []
    conn = db.connect()
    conn.set_trace_callback(seen.append)
    offer_memory_rpc(
        pb.OfferMemoryRequest(pool_id=POOL, idempotency_key="x", producer_id="p00003", bytes=GB),
        store,
    )
    allocate_memory_rpc(
        pb.AllocateMemoryRequest(pool_id=POOL, idempotency_key="y", consumer_id="c", bytes=GB),
        store,
    )
    conn.set_trace_callback(None)
    plans = [
        " ".join(str(r[3]) for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}"))
        for sql in seen
        if sql.startswith(("SELECT", "INSERT", "DELETE"))
    ]
    db.close()
    return plans


def test_an_offer_and_an_allocation_touch_the_same_rows_in_a_small_and_a_large_pool():
    small = _statements_of_one_offer(10)
    large = _statements_of_one_offer(2_000)
    assert len(small) == len(large)
    for plan in large:
        # Every lookup goes through a key or an index: no statement reads
        # the pool's rows one by one.
        assert "SCAN" not in plan, plan


def test_a_store_with_pool_documents_is_converted_to_rows(tmp_path: Path):
    """A file written when each pool was one JSON document (schema 1) opens
    with every producer, lease, reclaim and answered call."""
    model = Ledger()
    model.offer("p0", 8 * GB, "s0")
    model.offer("p1", 4 * GB, "s1")
    lease, _ = model.allocate("c0", 2 * GB, 1.0)
    assert lease is not None
    model.allocate("c1", GB, 2.0, producer_id="p1")
    model.reclaim("p0", 7 * GB, 3.0, 8.0)
    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(
        "CREATE TABLE placement_pool (pool_id TEXT PRIMARY KEY, revision INTEGER, state TEXT)"
    )
    conn.execute(
        "CREATE TABLE placement_request (pool_id TEXT, idempotency_key TEXT, method TEXT, "
        "digest TEXT, response BLOB, revision INTEGER, PRIMARY KEY (pool_id, idempotency_key))"
    )
    conn.execute(
        "INSERT INTO placement_pool VALUES (?, ?, ?)", (POOL, 5, json.dumps(model.to_dict()))
    )
    old_request = pb.OfferMemoryRequest(
        pool_id=POOL, idempotency_key="old", producer_id="p0", bytes=8 * GB, server_id="s0"
    )
    old_answer = pb.OfferMemoryResponse(revision=1)
    conn.execute(
        "INSERT INTO placement_request VALUES (?, ?, ?, ?, ?, ?)",
        (
            POOL,
            "old",
            "OfferMemory",
            placement_ledger.request_digest("OfferMemory", old_request),
            old_answer.SerializeToString(),
            1,
        ),
    )
    conn.execute("PRAGMA user_version=1")
    conn.close()

    store = ClusterStore(path)
    store.open()
    ask = pb.GetPoolStatusRequest(pool_id=POOL, now_s=10.0)
    assert get_pool_status_rpc(ask, store.ledger) == pool_status(model, 5, ask)
    replayed = offer_memory_rpc(old_request, store.ledger)
    assert replayed.replayed and replayed.revision == 1
    # The next lease continues the old numbering.
    granted = allocate_memory_rpc(
        pb.AllocateMemoryRequest(pool_id=POOL, idempotency_key="new", consumer_id="c", bytes=GB),
        store.ledger,
    )
    assert granted.lease.lease_id == "lease-3" and granted.revision == 6
    with store.db.reading() as c:
        tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert c.execute("PRAGMA user_version").fetchone()[0] == 2
    assert not tables & {"placement_pool", "placement_request"}
    store.close()
