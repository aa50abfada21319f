"""The planner's durable store for ClusterService: each cluster's state (its
current buddy plan, drop-trigger estimates, restore hysteresis) as one JSON
document per cluster in SQLite.

The connection, WAL/fsync settings and transactions are the shared store's
(planner/service/store.py); PlacementService's lease ledger lives in the same
file (`ClusterStore.ledger`). A read-modify-write of one cluster runs in one
IMMEDIATE transaction. No path (or ":memory:") keeps the state in memory only
(`planner call` in process, tests).

A call with an idempotency key is recorded (table cluster_request: its key,
a digest of its content, its serialized answer) in the same transaction as
the change it made, so a retry after a crash finds either both or neither.
Each cluster keeps the records of its last KEEP_KEYED_CALLS keyed calls.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf.message import Message

from planner.service.errors import InvalidArgumentError
from planner.service.idempotency import KeyedCall
from planner.service.ledger_sqlite import SqliteLedgerBackend
from planner.service.placement_ledger import LedgerStore
from planner.service.store import MEMORY, SCHEMA_VERSION, SqliteDatabase

T = TypeVar("T")
R = TypeVar("R", bound=Message)
__all__ = ["KEEP_KEYED_CALLS", "MEMORY", "SCHEMA_VERSION", "ClusterStore"]

# A retry comes within seconds of its call; a cluster's drop trigger is fed a
# few times a second, so this spans a minute or more of its calls.
KEEP_KEYED_CALLS = 256

_SCHEMA = (
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


class ClusterStore:
    def __init__(self, path: str | Path | None = None) -> None:
        self.db = SqliteDatabase(path)
        self.db.register_schema("cluster", _SCHEMA)
        # PlacementService's lease ledger, in the same file.
        self.ledger = LedgerStore(SqliteLedgerBackend(self.db))

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
            return _load(conn, cluster_id)

    def update(
        self, cluster_id: str, change: Callable[[dict[str, Any] | None], tuple[dict[str, Any], T]]
    ) -> tuple[T, int]:
        """Apply change(state) -> (new state, result) atomically; returns the
        result and the new revision. An exception in change leaves the stored
        state as it was."""
        with self.db.transaction() as conn:
            state, revision = _load(conn, cluster_id)
            new_state, result = change(state)
            _store(conn, cluster_id, revision + 1, new_state)
        return result, revision + 1

    def replay(self, cluster_id: str, call: KeyedCall, response_type: type[R]) -> R | None:
        """The recorded answer to call (replayed = true), or None when its
        key is unused; INVALID_ARGUMENT when the key answered other content."""
        with self.db.reading() as conn:
            return _recorded(conn, cluster_id, call, response_type)

    def answer(
        self,
        cluster_id: str,
        call: KeyedCall | None,
        response_type: type[R],
        change: Callable[[dict[str, Any] | None, int], tuple[dict[str, Any], R]],
    ) -> R:
        """Answers a state-changing call once per key: replays the recorded
        answer to the same (cluster, key, content); otherwise applies
        change(state, new revision) -> (new state, answer) and records the
        answer under the key, in one transaction. An exception in change
        leaves the state and the key as they were."""
        with self.db.transaction() as conn:
            if call is not None:
                recorded = _recorded(conn, cluster_id, call, response_type)
                if recorded is not None:
                    return recorded
            state, revision = _load(conn, cluster_id)
            revision += 1
            new_state, response = change(state, revision)
            _store(conn, cluster_id, revision, new_state)
            if call is not None:
                _record(conn, cluster_id, call, response, revision)
        return response

    def close(self) -> None:
        self.db.close()


def _load(conn: sqlite3.Connection, cluster_id: str) -> tuple[dict[str, Any] | None, int]:
    row = conn.execute(
        "SELECT state, revision FROM cluster_state WHERE cluster_id = ?", (cluster_id,)
    ).fetchone()
    if row is None:
        return None, 0
    return json.loads(row[0]), int(row[1])


def _store(conn: sqlite3.Connection, cluster_id: str, revision: int, state: dict[str, Any]) -> None:
    conn.execute(
        "INSERT INTO cluster_state (cluster_id, revision, state) VALUES (?, ?, ?) "
        "ON CONFLICT(cluster_id) DO UPDATE SET revision = excluded.revision, "
        "state = excluded.state",
        (cluster_id, revision, json.dumps(state, allow_nan=True)),
    )


def _recorded(
    conn: sqlite3.Connection, cluster_id: str, call: KeyedCall, response_type: type[R]
) -> R | None:
    row = conn.execute(
        "SELECT method, digest, response FROM cluster_request "
        "WHERE cluster_id = ? AND idempotency_key = ?",
        (cluster_id, call.key),
    ).fetchone()
    if row is None:
        return None
    if row[0] != call.method or row[1] != call.digest:
        raise InvalidArgumentError(
            "idempotency_key",
            f"{call.key!r} was used for a different {row[0]} call on cluster "
            f"{cluster_id!r}; use a new key for a new request",
        )
    answer = response_type.FromString(row[2])
    answer.replayed = True  # type: ignore[attr-defined]
    return answer


def _record(
    conn: sqlite3.Connection, cluster_id: str, call: KeyedCall, response: Message, revision: int
) -> None:
    conn.execute(
        "INSERT INTO cluster_request "
        "(cluster_id, idempotency_key, method, digest, response, revision) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (cluster_id, call.key, call.method, call.digest, response.SerializeToString(), revision),
    )
    # Revisions only grow, so the oldest records go first.
    conn.execute(
        "DELETE FROM cluster_request WHERE cluster_id = ? AND revision <= ("
        "SELECT revision FROM cluster_request WHERE cluster_id = ? "
        "ORDER BY revision DESC LIMIT 1 OFFSET ?)",
        (cluster_id, cluster_id, KEEP_KEYED_CALLS),
    )
