"""The lease ledger's rows in the SQLite store (planner.service.store).

Tables, each keyed by pool: ledger_pool (counters), ledger_producer (with
its lendable bytes, indexed so that the producer an allocation picks is one
index lookup), ledger_lease, ledger_reclaim (lease ids as a JSON list) and
ledger_request (answered calls, indexed by revision for pruning). A change
is one IMMEDIATE transaction, which holds SQLite's one write lock of the
file: pools take turns, each turn a few row writes long; it runs once.

A store written by an older planner kept each pool as one JSON document
(placement_pool, placement_request): opening it converts every pool to rows
in the schema transaction.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import TypeVar

from planner.domain.placement import Lease, ProducerAccount, Reclaim
from planner.policies.aqua.ledger import Ledger
from planner.service.ledger_columns import (
    LEASE_COLUMNS,
    PRODUCER_COLUMNS,
    RECLAIM_COLUMNS,
    LedgerRowCodec,
    record_seq,
)
from planner.service.ledger_rows import LedgerTransaction, PoolCounters, PoolRows, RecordedCall
from planner.service.store import SqliteDatabase

T = TypeVar("T")

_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS ledger_pool (
    pool_id TEXT PRIMARY KEY,
    revision INTEGER NOT NULL,
    next_lease INTEGER NOT NULL,
    next_reclaim INTEGER NOT NULL
)
""",
    """
CREATE TABLE IF NOT EXISTS ledger_producer (
    pool_id TEXT NOT NULL,
    producer_id TEXT NOT NULL,
    server_id TEXT NOT NULL,
    offered_bytes INTEGER NOT NULL,
    leased_bytes INTEGER NOT NULL,
    offered_total_bytes INTEGER NOT NULL,
    returned_total_bytes INTEGER NOT NULL,
    lendable_bytes INTEGER NOT NULL,
    PRIMARY KEY (pool_id, producer_id)
) WITHOUT ROWID
""",
    """
CREATE INDEX IF NOT EXISTS ledger_producer_by_lendable
    ON ledger_producer (pool_id, lendable_bytes DESC, producer_id)
""",
    """
CREATE INDEX IF NOT EXISTS ledger_producer_by_server
    ON ledger_producer (pool_id, server_id, lendable_bytes DESC, producer_id)
""",
    """
CREATE TABLE IF NOT EXISTS ledger_lease (
    pool_id TEXT NOT NULL,
    lease_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    producer_id TEXT NOT NULL,
    consumer_id TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    state TEXT NOT NULL,
    created_s REAL NOT NULL,
    reclaim_id TEXT NOT NULL,
    deadline_s REAL NOT NULL,
    PRIMARY KEY (pool_id, lease_id)
) WITHOUT ROWID
""",
    """
CREATE INDEX IF NOT EXISTS ledger_lease_by_producer
    ON ledger_lease (pool_id, producer_id, seq)
""",
    """
CREATE TABLE IF NOT EXISTS ledger_reclaim (
    pool_id TEXT NOT NULL,
    reclaim_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    producer_id TEXT NOT NULL,
    requested_bytes INTEGER NOT NULL,
    returned_bytes INTEGER NOT NULL,
    requested_s REAL NOT NULL,
    deadline_s REAL NOT NULL,
    lease_ids TEXT NOT NULL,
    complete INTEGER NOT NULL,
    PRIMARY KEY (pool_id, reclaim_id)
) WITHOUT ROWID
""",
    """
CREATE INDEX IF NOT EXISTS ledger_reclaim_by_producer
    ON ledger_reclaim (pool_id, producer_id, complete, seq)
""",
    """
CREATE INDEX IF NOT EXISTS ledger_reclaim_completed
    ON ledger_reclaim (pool_id, complete, seq)
""",
    """
CREATE TABLE IF NOT EXISTS ledger_request (
    pool_id TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    method TEXT NOT NULL,
    digest TEXT NOT NULL,
    response BLOB NOT NULL,
    revision INTEGER NOT NULL,
    PRIMARY KEY (pool_id, idempotency_key)
)
""",
    """
CREATE INDEX IF NOT EXISTS ledger_request_by_revision
    ON ledger_request (pool_id, revision)
""",
)


_ROWS = LedgerRowCodec(str, str)


class SqliteLedgerTransaction:
    """planner.service.ledger_rows.LedgerTransaction on one connection."""

    def __init__(self, conn: sqlite3.Connection, pool_id: str) -> None:
        self._conn = conn
        self._pool = pool_id

    def counters(self) -> PoolCounters | None:
        row = self._conn.execute(
            "SELECT revision, next_lease, next_reclaim FROM ledger_pool WHERE pool_id = ?",
            (self._pool,),
        ).fetchone()
        return None if row is None else PoolCounters(int(row[0]), int(row[1]), int(row[2]))

    def producer(self, producer_id: str) -> ProducerAccount | None:
        row = self._conn.execute(
            f"SELECT {PRODUCER_COLUMNS} FROM ledger_producer WHERE pool_id = ? AND producer_id = ?",
            (self._pool, producer_id),
        ).fetchone()
        return None if row is None else _ROWS.producer(row)

    def most_lendable_producer(self, server_id: str) -> ProducerAccount | None:
        if server_id:
            row = self._conn.execute(
                f"SELECT {PRODUCER_COLUMNS} FROM ledger_producer "
                "WHERE pool_id = ? AND server_id = ? "
                "ORDER BY lendable_bytes DESC, producer_id LIMIT 1",
                (self._pool, server_id),
            ).fetchone()
        else:
            row = self._conn.execute(
                f"SELECT {PRODUCER_COLUMNS} FROM ledger_producer WHERE pool_id = ? "
                "ORDER BY lendable_bytes DESC, producer_id LIMIT 1",
                (self._pool,),
            ).fetchone()
        return None if row is None else _ROWS.producer(row)

    def pending_reclaims(self, producer_id: str) -> list[Reclaim]:
        rows = self._conn.execute(
            f"SELECT {RECLAIM_COLUMNS} FROM ledger_reclaim "
            "WHERE pool_id = ? AND producer_id = ? AND complete = 0 ORDER BY seq",
            (self._pool, producer_id),
        ).fetchall()
        return [_ROWS.reclaim(r) for r in rows]

    def leases_of(self, producer_id: str) -> list[Lease]:
        rows = self._conn.execute(
            f"SELECT {LEASE_COLUMNS} FROM ledger_lease "
            "WHERE pool_id = ? AND producer_id = ? ORDER BY seq",
            (self._pool, producer_id),
        ).fetchall()
        return [_ROWS.lease(r) for r in rows]

    def lease(self, lease_id: str) -> Lease | None:
        row = self._conn.execute(
            f"SELECT {LEASE_COLUMNS} FROM ledger_lease WHERE pool_id = ? AND lease_id = ?",
            (self._pool, lease_id),
        ).fetchone()
        return None if row is None else _ROWS.lease(row)

    def recorded(self, key: str) -> RecordedCall | None:
        row = self._conn.execute(
            "SELECT method, digest, response FROM ledger_request "
            "WHERE pool_id = ? AND idempotency_key = ?",
            (self._pool, key),
        ).fetchone()
        return None if row is None else RecordedCall(str(row[0]), str(row[1]), bytes(row[2]))

    def put_counters(self, counters: PoolCounters) -> None:
        self._conn.execute(
            "INSERT INTO ledger_pool (pool_id, revision, next_lease, next_reclaim) "
            "VALUES (?, ?, ?, ?) ON CONFLICT(pool_id) DO UPDATE SET "
            "revision = excluded.revision, next_lease = excluded.next_lease, "
            "next_reclaim = excluded.next_reclaim",
            (self._pool, counters.revision, counters.next_lease, counters.next_reclaim),
        )

    def put_producer(self, account: ProducerAccount, lendable_bytes: int) -> None:
        self._conn.execute(
            f"INSERT OR REPLACE INTO ledger_producer (pool_id, {PRODUCER_COLUMNS}, "
            "lendable_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (self._pool, *_ROWS.producer_values(account, lendable_bytes)),
        )

    def put_lease(self, lease: Lease) -> None:
        self._conn.execute(
            f"INSERT OR REPLACE INTO ledger_lease (pool_id, seq, {LEASE_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (self._pool, record_seq(lease.lease_id), *_ROWS.lease_values(lease)),
        )

    def delete_lease(self, lease_id: str) -> None:
        self._conn.execute(
            "DELETE FROM ledger_lease WHERE pool_id = ? AND lease_id = ?", (self._pool, lease_id)
        )

    def put_reclaim(self, reclaim: Reclaim) -> None:
        self._conn.execute(
            f"INSERT OR REPLACE INTO ledger_reclaim (pool_id, seq, complete, {RECLAIM_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                self._pool,
                record_seq(reclaim.reclaim_id),
                int(reclaim.complete),
                *_ROWS.reclaim_values(reclaim),
            ),
        )

    def delete_reclaim(self, reclaim_id: str) -> None:
        self._conn.execute(
            "DELETE FROM ledger_reclaim WHERE pool_id = ? AND reclaim_id = ?",
            (self._pool, reclaim_id),
        )

    def prune_completed_reclaims(self, keep: int) -> None:
        self._conn.execute(
            "DELETE FROM ledger_reclaim WHERE pool_id = ? AND complete = 1 AND seq <= ("
            "SELECT seq FROM ledger_reclaim WHERE pool_id = ? AND complete = 1 "
            "ORDER BY seq DESC LIMIT 1 OFFSET ?)",
            (self._pool, self._pool, keep),
        )

    def record(self, key: str, call: RecordedCall, revision: int) -> None:
        self._conn.execute(
            "INSERT INTO ledger_request "
            "(pool_id, idempotency_key, method, digest, response, revision) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (self._pool, key, call.method, call.digest, call.response, revision),
        )

    def prune_records(self, up_to_revision: int) -> None:
        self._conn.execute(
            "DELETE FROM ledger_request WHERE pool_id = ? AND revision <= ?",
            (self._pool, up_to_revision),
        )


class SqliteLedgerBackend:
    """planner.service.ledger_rows.LedgerBackend on the planner's SQLite store."""

    def __init__(self, db: SqliteDatabase) -> None:
        self.db = db
        db.register_schema("ledger", _SCHEMA, migrate_pool_documents)

    def transact(self, pool_id: str, work: Callable[[LedgerTransaction], T]) -> T:
        with self.db.transaction() as conn:
            return work(SqliteLedgerTransaction(conn, pool_id))

    def rows(self, pool_id: str) -> PoolRows | None:
        with self.db.reading() as conn:
            counters = SqliteLedgerTransaction(conn, pool_id).counters()
            if counters is None:
                return None
            producers = conn.execute(
                f"SELECT {PRODUCER_COLUMNS} FROM ledger_producer WHERE pool_id = ? "
                "ORDER BY producer_id",
                (pool_id,),
            ).fetchall()
            leases = conn.execute(
                f"SELECT {LEASE_COLUMNS} FROM ledger_lease WHERE pool_id = ? ORDER BY seq",
                (pool_id,),
            ).fetchall()
            reclaims = conn.execute(
                f"SELECT {RECLAIM_COLUMNS} FROM ledger_reclaim WHERE pool_id = ? ORDER BY seq",
                (pool_id,),
            ).fetchall()
        return PoolRows(
            counters=counters,
            producers=[_ROWS.producer(r) for r in producers],
            leases=[_ROWS.lease(r) for r in leases],
            reclaims=[_ROWS.reclaim(r) for r in reclaims],
        )


def migrate_pool_documents(conn: sqlite3.Connection) -> None:
    """Converts pools kept as one JSON document each (tables placement_pool
    and placement_request) to rows, and drops the old tables."""
    tables = {
        str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }
    if "placement_pool" not in tables:
        return
    for pool_id, revision, state in conn.execute(
        "SELECT pool_id, revision, state FROM placement_pool"
    ).fetchall():
        ledger = Ledger.from_dict(json.loads(state))
        tx = SqliteLedgerTransaction(conn, str(pool_id))
        tx.put_counters(PoolCounters(int(revision), ledger.next_lease, ledger.next_reclaim))
        for pid, account in ledger.producers.items():
            tx.put_producer(account, ledger.lendable_bytes(pid))
        for lease in ledger.leases.values():
            tx.put_lease(lease)
        for reclaim in ledger.reclaims.values():
            tx.put_reclaim(reclaim)
    if "placement_request" in tables:
        conn.execute(
            "INSERT OR IGNORE INTO ledger_request "
            "(pool_id, idempotency_key, method, digest, response, revision) "
            "SELECT pool_id, idempotency_key, method, digest, response, revision "
            "FROM placement_request"
        )
        conn.execute("DROP TABLE placement_request")
    conn.execute("DROP TABLE placement_pool")
