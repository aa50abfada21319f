"""The planner's durable store: one SQLite file (WAL) shared by every
service that keeps state across restarts (ClusterService's plans,
PlacementService's lease ledger), each in its own tables.

WAL journal with synchronous=FULL: a change is on disk when the RPC that made
it answers, so a server killed with SIGKILL (or a power cut) restarts with
every answered change. One connection per store, serialized by a lock; a
change runs in one IMMEDIATE transaction, so two servers sharing a file also
see each other's changes whole. No path (or ":memory:") keeps the state in
memory only (`planner call` in process, tests).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
MEMORY = ":memory:"
SCHEMA_VERSION = 1


class SqliteDatabase:
    """One connection to the store file, opened on first use, with the
    tables of every service that registered its schema."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = MEMORY if path is None or str(path) in ("", MEMORY) else str(path)
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.RLock()
        self._schemas: dict[str, tuple[str, ...]] = {}
        self._applied: set[str] = set()

    @property
    def durable(self) -> bool:
        return self.path != MEMORY

    def register_schema(self, name: str, statements: tuple[str, ...]) -> None:
        """Tables (CREATE ... IF NOT EXISTS) created on the connection before
        its first use by name's owner; idempotent."""
        with self._lock:
            self._schemas.setdefault(name, statements)
            if self._conn is not None:
                self._apply(self._conn)

    def open(self) -> None:
        """Open (creating the file and its folder); raises OSError when it
        cannot."""
        with self._lock:
            self.connect()

    def connect(self) -> sqlite3.Connection:
        with self._lock:
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
                self._applied.clear()
                self._apply(conn)
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            except (sqlite3.Error, OSError) as exc:
                raise OSError(f"cannot open store {self.path}: {exc}") from exc
            self._conn = conn
            return conn

    def _apply(self, conn: sqlite3.Connection) -> None:
        for name, statements in self._schemas.items():
            if name in self._applied:
                continue
            for sql in statements:
                conn.execute(sql)
            self._applied.add(name)

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """The connection, held under the store's lock (no transaction)."""
        with self._lock:
            yield self.connect()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction: committed when the block ends, rolled
        back (nothing written) when it raises."""
        with self._lock:
            conn = self.connect()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def run(self, change: Callable[[sqlite3.Connection], T]) -> T:
        """change(conn) inside one transaction."""
        with self.transaction() as conn:
            return change(conn)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
                self._applied.clear()
