"""ClusterService's state in the SQLite store (planner.service.store):
tables cluster_state (one JSON document per cluster) and cluster_request
(answered calls, indexed by revision for pruning). A change is one
IMMEDIATE transaction."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import TypeVar

from planner.service.cluster_rows import ClusterTransaction, State
from planner.service.idempotency import RecordedCall
from planner.service.store import SqliteDatabase

T = TypeVar("T")

SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS cluster_state (
    cluster_id TEXT PRIMARY KEY,
    revision INTEGER NOT NULL,
    state TEXT NOT NULL
)
""",
    """
CREATE TABLE IF NOT EXISTS cluster_request (
    cluster_id TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    method TEXT NOT NULL,
    digest TEXT NOT NULL,
    response BLOB NOT NULL,
    revision INTEGER NOT NULL,
    PRIMARY KEY (cluster_id, idempotency_key)
)
""",
    """
CREATE INDEX IF NOT EXISTS cluster_request_by_revision
    ON cluster_request (cluster_id, revision)
""",
)


class SqliteClusterTransaction:
    """planner.service.cluster_rows.ClusterTransaction on one connection."""

    def __init__(self, conn: sqlite3.Connection, cluster_id: str) -> None:
        self._conn = conn
        self._cluster = cluster_id

    def load(self) -> tuple[State | None, int]:
        row = self._conn.execute(
            "SELECT state, revision FROM cluster_state WHERE cluster_id = ?", (self._cluster,)
        ).fetchone()
        if row is None:
            return None, 0
        return json.loads(row[0]), int(row[1])

    def store(self, revision: int, state: State) -> None:
        self._conn.execute(
            "INSERT INTO cluster_state (cluster_id, revision, state) VALUES (?, ?, ?) "
            "ON CONFLICT(cluster_id) DO UPDATE SET revision = excluded.revision, "
            "state = excluded.state",
            (self._cluster, revision, json.dumps(state, allow_nan=True)),
        )

    def recorded(self, key: str) -> RecordedCall | None:
        row = self._conn.execute(
            "SELECT method, digest, response FROM cluster_request "
            "WHERE cluster_id = ? AND idempotency_key = ?",
            (self._cluster, key),
        ).fetchone()
        return None if row is None else RecordedCall(str(row[0]), str(row[1]), bytes(row[2]))

    def record(self, key: str, call: RecordedCall, revision: int, keep: int) -> None:
        self._conn.execute(
            "INSERT INTO cluster_request "
            "(cluster_id, idempotency_key, method, digest, response, revision) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (self._cluster, key, call.method, call.digest, call.response, revision),
        )
        # Revisions only grow, so the oldest records go first.
        self._conn.execute(
            "DELETE FROM cluster_request WHERE cluster_id = ? AND revision <= ("
            "SELECT revision FROM cluster_request WHERE cluster_id = ? "
            "ORDER BY revision DESC LIMIT 1 OFFSET ?)",
            (self._cluster, self._cluster, keep),
        )


class SqliteClusterBackend:
    """planner.service.cluster_rows.ClusterBackend on the planner's SQLite store."""

    def __init__(self, db: SqliteDatabase) -> None:
        self.db = db
        db.register_schema("cluster", SCHEMA)

    def transact(self, cluster_id: str, work: Callable[[ClusterTransaction], T]) -> T:
        with self.db.transaction() as conn:
            return work(SqliteClusterTransaction(conn, cluster_id))

    def read(self, cluster_id: str, work: Callable[[ClusterTransaction], T]) -> T:
        with self.db.reading() as conn:
            return work(SqliteClusterTransaction(conn, cluster_id))
