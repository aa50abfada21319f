"""planner.service.cluster_rows.ClusterTransaction over one SQL connection,
for both stores: tables cluster_state (one JSON document per cluster) and
cluster_request (answered calls, indexed by revision for pruning). The
statements are written once with ``?`` placeholders; a dialect says how its
driver spells them and how it keys a cluster (SQLite: text, PostgreSQL:
UTF-8 bytes)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from planner.service.cluster_rows import State
from planner.service.idempotency import RecordedCall


class Cursor(Protocol):
    def fetchone(self) -> Any: ...


class Connection(Protocol):
    """What both drivers' connections offer (sqlite3 and psycopg)."""

    def execute(self, sql: str, params: tuple[Any, ...], /) -> Cursor: ...


@dataclass(frozen=True, slots=True)
class Dialect:
    placeholder: str
    key: Callable[[str], str | bytes]

    def sql(self, statement: str) -> str:
        return statement.replace("?", self.placeholder)


SQLITE = Dialect("?", str)
POSTGRES = Dialect("%s", lambda text: text.encode("utf-8"))


class SqlClusterTransaction:
    """One cluster's rows on a connection inside its transaction."""

    def __init__(self, conn: Connection, cluster_id: str, dialect: Dialect) -> None:
        self._conn = conn
        self._dialect = dialect
        self._cluster = dialect.key(cluster_id)

    def _execute(self, statement: str, *params: Any) -> Cursor:
        return self._conn.execute(self._dialect.sql(statement), params)

    def load(self) -> tuple[State | None, int]:
        row = self._execute(
            "SELECT state, revision FROM cluster_state WHERE cluster_id = ?", self._cluster
        ).fetchone()
        if row is None:
            return None, 0
        return json.loads(row[0]), int(row[1])

    def store(self, revision: int, state: State) -> None:
        self._execute(
            "INSERT INTO cluster_state (cluster_id, revision, state) VALUES (?, ?, ?) "
            "ON CONFLICT (cluster_id) DO UPDATE SET revision = excluded.revision, "
            "state = excluded.state",
            self._cluster,
            revision,
            json.dumps(state, allow_nan=True),
        )

    def recorded(self, key: str) -> RecordedCall | None:
        row = self._execute(
            "SELECT method, digest, response FROM cluster_request "
            "WHERE cluster_id = ? AND idempotency_key = ?",
            self._cluster,
            self._dialect.key(key),
        ).fetchone()
        return None if row is None else RecordedCall(str(row[0]), str(row[1]), bytes(row[2]))

    def record(self, key: str, call: RecordedCall, revision: int, keep: int) -> None:
        self._execute(
            "INSERT INTO cluster_request "
            "(cluster_id, idempotency_key, method, digest, response, revision) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            self._cluster,
            self._dialect.key(key),
            call.method,
            call.digest,
            call.response,
            revision,
        )
        # Revisions only grow, so the oldest records go first.
        self._execute(
            "DELETE FROM cluster_request WHERE cluster_id = ? AND revision <= ("
            "SELECT revision FROM cluster_request WHERE cluster_id = ? "
            "ORDER BY revision DESC LIMIT 1 OFFSET ?)",
            self._cluster,
            self._cluster,
            keep,
        )
