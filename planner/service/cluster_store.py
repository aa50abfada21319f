"""The planner's durable store for ClusterService: each cluster's state (its
current buddy plan, drop-trigger estimates, restore hysteresis) as one JSON
document per cluster in SQLite.

WAL journal with synchronous=FULL: a change is on disk when the RPC that made
it answers, so a server killed with SIGKILL (or a power cut) restarts with
every answered change. One connection per store, serialized by a lock; a
read-modify-write of one cluster runs in one IMMEDIATE transaction, so two
servers sharing a file also see each other's changes whole. No path (or
":memory:") keeps the state in memory only (`planner call` in process,
tests).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
MEMORY = ":memory:"
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS cluster_state (
    cluster_id TEXT PRIMARY KEY,
    revision INTEGER NOT NULL,
    state TEXT NOT NULL
)
"""


class ClusterStore:
    def __init__(self, path: str | Path | None = None) -> None:
        self.path = MEMORY if path is None or str(path) in ("", MEMORY) else str(path)
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    @property
    def durable(self) -> bool:
        return self.path != MEMORY

    def open(self) -> None:
        """Open (creating the file and its folder); raises OSError when it
        cannot."""
        with self._lock:
            self._connect()

    def _connect(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        try:
            if self.durable:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self.path, timeout=10.0, isolation_level=None, check_same_thread=False
            )
            if self.durable:
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise sqlite3.OperationalError(f"cannot use WAL journal (got {mode})")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(_SCHEMA)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except (sqlite3.Error, OSError) as exc:
            raise OSError(f"cannot open store {self.path}: {exc}") from exc
        self._conn = conn
        return conn

    def read(self, cluster_id: str) -> tuple[dict[str, Any] | None, int]:
        """The cluster's state and revision (None, 0 when absent)."""
        with self._lock:
            row = (
                self._connect()
                .execute(
                    "SELECT state, revision FROM cluster_state WHERE cluster_id = ?",
                    (cluster_id,),
                )
                .fetchone()
            )
        if row is None:
            return None, 0
        return json.loads(row[0]), int(row[1])

    def update(
        self, cluster_id: str, change: Callable[[dict[str, Any] | None], tuple[dict[str, Any], T]]
    ) -> tuple[T, int]:
        """Apply change(state) -> (new state, result) atomically; returns the
        result and the new revision. An exception in change leaves the stored
        state as it was."""
        with self._lock:
            conn = self._connect()
            conn.execute("BEGIN IMMEDIATE")
            try:
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
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        return result, revision

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
