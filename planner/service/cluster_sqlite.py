"""ClusterService's state in the SQLite store (planner.service.store): the
schema of planner.service.cluster_sql's tables; a change is one IMMEDIATE
transaction."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from planner.service.cluster_rows import ClusterTransaction
from planner.service.cluster_sql import SQLITE, SqlClusterTransaction
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


class SqliteClusterBackend:
    """planner.service.cluster_rows.ClusterBackend on the planner's SQLite store."""

    def __init__(self, db: SqliteDatabase) -> None:
        self.db = db
        db.register_schema("cluster", SCHEMA)

    def transact(self, cluster_id: str, work: Callable[[ClusterTransaction], T]) -> T:
        with self.db.transaction() as conn:
            return work(SqlClusterTransaction(conn, cluster_id, SQLITE))

    def read(self, cluster_id: str, work: Callable[[ClusterTransaction], T]) -> T:
        with self.db.reading() as conn:
            return work(SqlClusterTransaction(conn, cluster_id, SQLITE))
