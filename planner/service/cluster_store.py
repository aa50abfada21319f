"""The planner's durable store: ClusterService's state (each cluster's
current buddy plan, drop-trigger estimates, restore hysteresis, as one JSON
document per cluster) and PlacementService's lease ledger (`.ledger`), in
one database:

- a SQLite file (planner/service/store.py: WAL, fsync per change), the
  embedded default; no path (or ":memory:") keeps the state in memory only
  (`planner call` in process, tests);
- a PostgreSQL database (a postgresql:// URL;
  planner/service/postgres_database.py), which several planner replicas
  share.

A read-modify-write of one cluster runs in one transaction of its
backend (planner.service.cluster_rows). A call with an idempotency key is
recorded (its key, a digest of its content, its serialized answer) in the
same transaction as the change it made, so a retry after a crash finds
either both or neither. Each cluster keeps the records of its last
KEEP_KEYED_CALLS keyed calls.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf.message import Message

from planner.service.cluster_rows import ClusterBackend, ClusterTransaction, State
from planner.service.cluster_sqlite import SqliteClusterBackend
from planner.service.database import Database
from planner.service.errors import InvalidArgumentError
from planner.service.idempotency import KeyedCall, RecordedCall
from planner.service.ledger_sqlite import SqliteLedgerBackend
from planner.service.placement_ledger import LedgerStore
from planner.service.store import MEMORY, SCHEMA_VERSION, SqliteDatabase
from planner.service.store_location import is_postgresql_url, without_password

T = TypeVar("T")
R = TypeVar("R", bound=Message)
__all__ = ["KEEP_KEYED_CALLS", "MEMORY", "SCHEMA_VERSION", "ClusterStore"]

# A retry comes within seconds of its call; a cluster's drop trigger is fed a
# few times a second, so this spans a minute or more of its calls.
KEEP_KEYED_CALLS = 256
# Connections to a PostgreSQL store, per process.
DEFAULT_POOL_SIZE = 8


class ClusterStore:
    def __init__(
        self, location: str | Path | None = None, *, pool_size: int = DEFAULT_POOL_SIZE
    ) -> None:
        """location: a SQLite file, None or ":memory:", or a postgresql:// URL
        (pool_size connections at most)."""
        self.db: Database
        self._backend: ClusterBackend
        if location is not None and is_postgresql_url(str(location)):
            # psycopg (the postgresql extra) is imported only for this store.
            try:
                from planner.service.cluster_postgres import PostgresClusterBackend  # noqa: PLC0415
                from planner.service.ledger_postgres import PostgresLedgerBackend  # noqa: PLC0415
                from planner.service.postgres_database import PostgresDatabase  # noqa: PLC0415
            except ImportError as exc:
                raise OSError(
                    f"cannot open store {without_password(str(location))}: a PostgreSQL store "
                    f"needs psycopg and psycopg-pool (pip install 'planner[postgresql]'): {exc}"
                ) from None

            postgres = PostgresDatabase(str(location), pool_size)
            self.db = postgres
            self._backend = PostgresClusterBackend(postgres)
            self.ledger = LedgerStore(PostgresLedgerBackend(postgres))
        else:
            sqlite = SqliteDatabase(location)
            self.db = sqlite
            self._backend = SqliteClusterBackend(sqlite)
            # PlacementService's lease ledger, in the same file.
            self.ledger = LedgerStore(SqliteLedgerBackend(sqlite))

    @property
    def path(self) -> str:
        """Where the store is (a URL without its password)."""
        return self.db.path

    @property
    def durable(self) -> bool:
        return self.db.durable

    def open(self) -> None:
        """Open (creating a file and its folder, or a database's tables);
        raises OSError naming the store when it cannot."""
        self.db.open()

    def read(self, cluster_id: str) -> tuple[dict[str, Any] | None, int]:
        """The cluster's state and revision (None, 0 when absent)."""
        return self._backend.read(cluster_id, lambda tx: tx.load())

    def update(
        self, cluster_id: str, change: Callable[[dict[str, Any] | None], tuple[dict[str, Any], T]]
    ) -> tuple[T, int]:
        """Apply change(state) -> (new state, result) atomically; returns the
        result and the new revision. An exception in change leaves the stored
        state as it was."""

        def work(tx: ClusterTransaction) -> tuple[T, int]:
            state, revision = tx.load()
            new_state, result = change(state)
            tx.store(revision + 1, new_state)
            return result, revision + 1

        return self._backend.transact(cluster_id, work)

    def replay(self, cluster_id: str, call: KeyedCall, response_type: type[R]) -> R | None:
        """The recorded answer to call (replayed = true), or None when its
        key is unused; INVALID_ARGUMENT when the key answered other content."""
        return self._backend.read(
            cluster_id, lambda tx: _replayed(tx, cluster_id, call, response_type)
        )

    def answer(
        self,
        cluster_id: str,
        call: KeyedCall | None,
        response_type: type[R],
        change: Callable[[State | None, int], tuple[State, R]],
    ) -> R:
        """Answers a state-changing call once per key: replays the recorded
        answer to the same (cluster, key, content); otherwise applies
        change(state, new revision) -> (new state, answer) and records the
        answer under the key, in one transaction. An exception in change
        leaves the state and the key as they were. change may run again if
        the backend retries the transaction."""

        def work(tx: ClusterTransaction) -> R:
            if call is not None:
                recorded = _replayed(tx, cluster_id, call, response_type)
                if recorded is not None:
                    return recorded
            state, revision = tx.load()
            revision += 1
            new_state, response = change(state, revision)
            tx.store(revision, new_state)
            if call is not None:
                tx.record(
                    call.key,
                    RecordedCall(call.method, call.digest, response.SerializeToString()),
                    revision,
                    KEEP_KEYED_CALLS,
                )
            return response

        return self._backend.transact(cluster_id, work)

    def close(self) -> None:
        self.db.close()


def _replayed(
    tx: ClusterTransaction, cluster_id: str, call: KeyedCall, response_type: type[R]
) -> R | None:
    recorded = tx.recorded(call.key)
    if recorded is None:
        return None
    if recorded.method != call.method or recorded.digest != call.digest:
        raise InvalidArgumentError(
            "idempotency_key",
            f"{call.key!r} was used for a different {recorded.method} call on cluster "
            f"{cluster_id!r}; use a new key for a new request",
        )
    answer = response_type.FromString(recorded.response)
    answer.replayed = True  # type: ignore[attr-defined]
    return answer
