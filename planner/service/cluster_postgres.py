"""ClusterService's state in PostgreSQL (planner.service.postgres_database),
shared by every planner replica on the database: the tables of
planner.service.postgres_schema, the statements of
planner.service.cluster_sql, ids as UTF-8 bytes. A change holds the
cluster's advisory lock around one SERIALIZABLE transaction."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from planner.service.cluster_rows import ClusterTransaction
from planner.service.cluster_sql import POSTGRES, SqlClusterTransaction
from planner.service.postgres_database import CLUSTER_LOCK, LockKey, PostgresDatabase

T = TypeVar("T")


class PostgresClusterBackend:
    """planner.service.cluster_rows.ClusterBackend on a PostgreSQL store."""

    def __init__(self, db: PostgresDatabase) -> None:
        self.db = db

    def transact(self, cluster_id: str, work: Callable[[ClusterTransaction], T]) -> T:
        return self.db.run(
            lambda conn: work(SqlClusterTransaction(conn, cluster_id, POSTGRES)),
            lock=LockKey(CLUSTER_LOCK, cluster_id.encode("utf-8")),
        )

    def read(self, cluster_id: str, work: Callable[[ClusterTransaction], T]) -> T:
        return self.db.run(
            lambda conn: work(SqlClusterTransaction(conn, cluster_id, POSTGRES)), read_only=True
        )
