"""The planner's durable store for ClusterService: each cluster's state (its
current buddy plan, drop-trigger estimates, restore hysteresis) as one JSON
document per cluster in SQLite.

The connection, WAL/fsync settings and transactions are the shared store's
(planner/service/store.py); PlacementService's lease ledger lives in the same
file through `ClusterStore.db`. A read-modify-write of one cluster runs in one
IMMEDIATE transaction. No path (or ":memory:") keeps the state in memory only
(`planner call` in process, tests).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from planner.service.store import MEMORY, SCHEMA_VERSION, SqliteDatabase

T = TypeVar("T")
__all__ = ["MEMORY", "SCHEMA_VERSION", "ClusterStore"]

_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS cluster_state (
    cluster_id TEXT PRIMARY KEY,
    revision INTEGER NOT NULL,
    state TEXT NOT NULL
)
""",
)


class ClusterStore:
    def __init__(self, path: str | Path | None = None) -> None:
        self.db = SqliteDatabase(path)
        self.db.register_schema("cluster", _SCHEMA)

    @property
    def path(self) -> str:
        return self.db.path

    @property
    def durable(self) -> bool:
        return self.db.durable

    def open(self) -> None:
        """Open (creating the file and its folder); raises OSError when it
        cannot."""
        self.db.open()

    def read(self, cluster_id: str) -> tuple[dict[str, Any] | None, int]:
        """The cluster's state and revision (None, 0 when absent)."""
        with self.db.reading() as conn:
            row = conn.execute(
                "SELECT state, revision FROM cluster_state WHERE cluster_id = ?",
                (cluster_id,),
            ).fetchone()
        if row is None:
            return None, 0
        return json.loads(row[0]), int(row[1])

    def update(
        self, cluster_id: str, change: Callable[[dict[str, Any] | None], tuple[dict[str, Any], T]]
    ) -> tuple[T, int]:
        """Apply change(state) -> (new state, result) atomically; returns the
        result and the new revision. An exception in change leaves the stored
        state as it was."""
        with self.db.transaction() as conn:
            row = conn.execute(
                "SELECT state, revision FROM cluster_state WHERE cluster_id = ?",
                (cluster_id,),
            ).fetchone()
            state = None if row is None else json.loads(row[0])
            revision = 0 if row is None else int(row[1])
            new_state, result = change(state)
            revision += 1
            conn.execute(
                "INSERT INTO cluster_state (cluster_id, revision, state) VALUES (?, ?, ?) "
                "ON CONFLICT(cluster_id) DO UPDATE SET revision = excluded.revision, "
                "state = excluded.state",
                (cluster_id, revision, json.dumps(new_state, allow_nan=True)),
            )
        return result, revision

    def close(self) -> None:
        self.db.close()
