"""ClusterService's state in PostgreSQL (planner.service.postgres_database),
shared by every planner replica on the database: the tables of
planner.service.postgres_schema, the statements of the SQLite backend
(planner.service.cluster_sqlite), ids as UTF-8 bytes. A change holds the
cluster's advisory lock around one SERIALIZABLE transaction."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypeVar

import psycopg

from planner.service.cluster_rows import ClusterTransaction, State
from planner.service.idempotency import RecordedCall
from planner.service.postgres_database import CLUSTER_LOCK, LockKey, PostgresDatabase

T = TypeVar("T")


class PostgresClusterTransaction:
    """planner.service.cluster_rows.ClusterTransaction on one connection,
    inside its transaction."""

    def __init__(self, conn: psycopg.Connection, cluster_id: str) -> None:
        self._conn = conn
        self._cluster = cluster_id.encode("utf-8")

    def load(self) -> tuple[State | None, int]:
        row = self._conn.execute(
            "SELECT state, revision FROM cluster_state WHERE cluster_id = %s", (self._cluster,)
        ).fetchone()
        if row is None:
            return None, 0
        return json.loads(row[0]), int(row[1])

    def store(self, revision: int, state: State) -> None:
        self._conn.execute(
            "INSERT INTO cluster_state (cluster_id, revision, state) VALUES (%s, %s, %s) "
            "ON CONFLICT (cluster_id) DO UPDATE SET revision = excluded.revision, "
            "state = excluded.state",
            (self._cluster, revision, json.dumps(state, allow_nan=True)),
        )

    def recorded(self, key: str) -> RecordedCall | None:
        row = self._conn.execute(
            "SELECT method, digest, response FROM cluster_request "
            "WHERE cluster_id = %s AND idempotency_key = %s",
            (self._cluster, key.encode("utf-8")),
        ).fetchone()
        return None if row is None else RecordedCall(str(row[0]), str(row[1]), bytes(row[2]))

    def record(self, key: str, call: RecordedCall, revision: int, keep: int) -> None:
        self._conn.execute(
            "INSERT INTO cluster_request "
            "(cluster_id, idempotency_key, method, digest, response, revision) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
            (
                self._cluster,
                key.encode("utf-8"),
                call.method,
                call.digest,
                call.response,
                revision,
            ),
        )
        self._conn.execute(
            "DELETE FROM cluster_request WHERE cluster_id = %s AND revision <= ("
            "SELECT revision FROM cluster_request WHERE cluster_id = %s "
            "ORDER BY revision DESC LIMIT 1 OFFSET %s)",
            (self._cluster, self._cluster, keep),
        )


class PostgresClusterBackend:
    """planner.service.cluster_rows.ClusterBackend on a PostgreSQL store."""

    def __init__(self, db: PostgresDatabase) -> None:
        self.db = db

    def transact(self, cluster_id: str, work: Callable[[ClusterTransaction], T]) -> T:
        return self.db.run(
            lambda conn: work(PostgresClusterTransaction(conn, cluster_id)),
            lock=LockKey(CLUSTER_LOCK, cluster_id.encode("utf-8")),
        )

    def read(self, cluster_id: str, work: Callable[[ClusterTransaction], T]) -> T:
        return self.db.run(
            lambda conn: work(PostgresClusterTransaction(conn, cluster_id)), read_only=True
        )
