"""The lease ledger's rows in PostgreSQL (planner.service.postgres_database),
shared by every planner replica on the same database: the tables of
planner.service.postgres_schema, the same statements as the SQLite backend
(planner.service.ledger_sqlite), ids as UTF-8 bytes.

A change of a pool holds the pool's advisory lock around one SERIALIZABLE
transaction: calls of one pool, from any replica, apply one after another,
and any transaction the database cannot serialize (two pools' rows on one
index page, say) is rolled back and run again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import psycopg

from planner.domain.placement import Lease, ProducerAccount, Reclaim
from planner.service.ledger_columns import (
    LEASE_COLUMNS,
    PRODUCER_COLUMNS,
    RECLAIM_COLUMNS,
    LedgerRowCodec,
    Row,
    column_int,
    record_seq,
)
from planner.service.ledger_rows import LedgerTransaction, PoolCounters, PoolRows, RecordedCall
from planner.service.postgres_database import LEDGER_POOL_LOCK, LockKey, PostgresDatabase

T = TypeVar("T")

_SELECT_PRODUCER = f"SELECT {PRODUCER_COLUMNS} FROM ledger_producer"
_SELECT_LEASE = f"SELECT {LEASE_COLUMNS} FROM ledger_lease"
_SELECT_RECLAIM = f"SELECT {RECLAIM_COLUMNS} FROM ledger_reclaim"


def _b(text: str) -> bytes:
    return text.encode("utf-8")


def _s(value: object) -> str:
    assert isinstance(value, bytes | memoryview), type(value)
    return bytes(value).decode("utf-8")


# Ids as UTF-8 bytes.
_ROWS = LedgerRowCodec(_b, _s)


class PostgresLedgerTransaction:
    """planner.service.ledger_rows.LedgerTransaction on one connection, inside
    its transaction."""

    def __init__(self, conn: psycopg.Connection, pool_id: str) -> None:
        self._conn = conn
        self._pool = _b(pool_id)

    def _one(self, query: str, params: tuple[object, ...]) -> Row | None:
        row: Row | None = self._conn.execute(query, params).fetchone()
        return row

    def all_rows(self, query: str, params: tuple[object, ...]) -> list[Row]:
        rows: list[Row] = self._conn.execute(query, params).fetchall()
        return rows

    def _run(self, query: str, params: tuple[object, ...]) -> None:
        self._conn.execute(query, params)

    def counters(self) -> PoolCounters | None:
        row = self._one(
            "SELECT revision, next_lease, next_reclaim FROM ledger_pool WHERE pool_id = %s",
            (self._pool,),
        )
        return (
            None
            if row is None
            else PoolCounters(column_int(row[0]), column_int(row[1]), column_int(row[2]))
        )

    def producer(self, producer_id: str) -> ProducerAccount | None:
        row = self._one(
            f"{_SELECT_PRODUCER} WHERE pool_id = %s AND producer_id = %s",
            (self._pool, _b(producer_id)),
        )
        return None if row is None else _ROWS.producer(row)

    def most_lendable_producer(self, server_id: str) -> ProducerAccount | None:
        if server_id:
            row = self._one(
                f"{_SELECT_PRODUCER} WHERE pool_id = %s AND server_id = %s "
                "ORDER BY lendable_bytes DESC, producer_id LIMIT 1",
                (self._pool, _b(server_id)),
            )
        else:
            row = self._one(
                f"{_SELECT_PRODUCER} WHERE pool_id = %s "
                "ORDER BY lendable_bytes DESC, producer_id LIMIT 1",
                (self._pool,),
            )
        return None if row is None else _ROWS.producer(row)

    def pending_reclaims(self, producer_id: str) -> list[Reclaim]:
        rows = self.all_rows(
            f"{_SELECT_RECLAIM} WHERE pool_id = %s AND producer_id = %s AND NOT complete "
            "ORDER BY seq",
            (self._pool, _b(producer_id)),
        )
        return [_ROWS.reclaim(r) for r in rows]

    def leases_of(self, producer_id: str) -> list[Lease]:
        rows = self.all_rows(
            f"{_SELECT_LEASE} WHERE pool_id = %s AND producer_id = %s ORDER BY seq",
            (self._pool, _b(producer_id)),
        )
        return [_ROWS.lease(r) for r in rows]

    def lease(self, lease_id: str) -> Lease | None:
        row = self._one(
            f"{_SELECT_LEASE} WHERE pool_id = %s AND lease_id = %s",
            (self._pool, _b(lease_id)),
        )
        return None if row is None else _ROWS.lease(row)

    def recorded(self, key: str) -> RecordedCall | None:
        row = self._one(
            "SELECT method, digest, response FROM ledger_request "
            "WHERE pool_id = %s AND idempotency_key = %s",
            (self._pool, _b(key)),
        )
        if row is None:
            return None
        response = row[2]
        assert isinstance(response, bytes | memoryview)
        return RecordedCall(str(row[0]), str(row[1]), bytes(response))

    def put_counters(self, counters: PoolCounters) -> None:
        self._run(
            "INSERT INTO ledger_pool (pool_id, revision, next_lease, next_reclaim) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT (pool_id) DO UPDATE SET "
            "revision = excluded.revision, next_lease = excluded.next_lease, "
            "next_reclaim = excluded.next_reclaim",
            (self._pool, counters.revision, counters.next_lease, counters.next_reclaim),
        )

    def put_producer(self, account: ProducerAccount, lendable_bytes: int) -> None:
        self._run(
            f"INSERT INTO ledger_producer (pool_id, {PRODUCER_COLUMNS}, lendable_bytes) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (pool_id, producer_id) DO UPDATE SET "
            "server_id = excluded.server_id, offered_bytes = excluded.offered_bytes, "
            "leased_bytes = excluded.leased_bytes, "
            "offered_total_bytes = excluded.offered_total_bytes, "
            "returned_total_bytes = excluded.returned_total_bytes, "
            "lendable_bytes = excluded.lendable_bytes",
            (self._pool, *_ROWS.producer_values(account, lendable_bytes)),
        )

    def put_lease(self, lease: Lease) -> None:
        self._run(
            f"INSERT INTO ledger_lease (pool_id, seq, {LEASE_COLUMNS}) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (pool_id, lease_id) DO UPDATE SET "
            "seq = excluded.seq, producer_id = excluded.producer_id, "
            "consumer_id = excluded.consumer_id, bytes = excluded.bytes, "
            "state = excluded.state, created_s = excluded.created_s, "
            "reclaim_id = excluded.reclaim_id, deadline_s = excluded.deadline_s",
            (self._pool, record_seq(lease.lease_id), *_ROWS.lease_values(lease)),
        )

    def delete_lease(self, lease_id: str) -> None:
        self._run(
            "DELETE FROM ledger_lease WHERE pool_id = %s AND lease_id = %s",
            (self._pool, _b(lease_id)),
        )

    def put_reclaim(self, reclaim: Reclaim) -> None:
        self._run(
            f"INSERT INTO ledger_reclaim (pool_id, seq, complete, {RECLAIM_COLUMNS}) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (pool_id, reclaim_id) DO UPDATE SET "
            "seq = excluded.seq, complete = excluded.complete, "
            "producer_id = excluded.producer_id, requested_bytes = excluded.requested_bytes, "
            "returned_bytes = excluded.returned_bytes, requested_s = excluded.requested_s, "
            "deadline_s = excluded.deadline_s, lease_ids = excluded.lease_ids",
            (
                self._pool,
                record_seq(reclaim.reclaim_id),
                reclaim.complete,
                *_ROWS.reclaim_values(reclaim),
            ),
        )

    def delete_reclaim(self, reclaim_id: str) -> None:
        self._run(
            "DELETE FROM ledger_reclaim WHERE pool_id = %s AND reclaim_id = %s",
            (self._pool, _b(reclaim_id)),
        )

    def prune_completed_reclaims(self, keep: int) -> None:
        self._run(
            "DELETE FROM ledger_reclaim WHERE pool_id = %s AND complete AND seq <= ("
            "SELECT seq FROM ledger_reclaim WHERE pool_id = %s AND complete "
            "ORDER BY seq DESC LIMIT 1 OFFSET %s)",
            (self._pool, self._pool, keep),
        )

    def record(self, key: str, call: RecordedCall, revision: int) -> None:
        self._run(
            "INSERT INTO ledger_request "
            "(pool_id, idempotency_key, method, digest, response, revision) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
            (self._pool, _b(key), call.method, call.digest, call.response, revision),
        )

    def prune_records(self, up_to_revision: int) -> None:
        self._run(
            "DELETE FROM ledger_request WHERE pool_id = %s AND revision <= %s",
            (self._pool, up_to_revision),
        )


class PostgresLedgerBackend:
    """planner.service.ledger_rows.LedgerBackend on a PostgreSQL store."""

    def __init__(self, db: PostgresDatabase) -> None:
        self.db = db

    def transact(self, pool_id: str, work: Callable[[LedgerTransaction], T]) -> T:
        def attempt(conn: psycopg.Connection) -> T:
            return work(PostgresLedgerTransaction(conn, pool_id))

        return self.db.run(attempt, lock=LockKey(LEDGER_POOL_LOCK, _b(pool_id)))

    def rows(self, pool_id: str) -> PoolRows | None:
        def read(conn: psycopg.Connection) -> PoolRows | None:
            tx = PostgresLedgerTransaction(conn, pool_id)
            counters = tx.counters()
            if counters is None:
                return None
            pool = (_b(pool_id),)
            return PoolRows(
                counters=counters,
                producers=[
                    _ROWS.producer(r)
                    for r in tx.all_rows(
                        f"{_SELECT_PRODUCER} WHERE pool_id = %s ORDER BY producer_id", pool
                    )
                ],
                leases=[
                    _ROWS.lease(r)
                    for r in tx.all_rows(f"{_SELECT_LEASE} WHERE pool_id = %s ORDER BY seq", pool)
                ],
                reclaims=[
                    _ROWS.reclaim(r)
                    for r in tx.all_rows(f"{_SELECT_RECLAIM} WHERE pool_id = %s ORDER BY seq", pool)
                ],
            )

        return self.db.run(read, read_only=True)
