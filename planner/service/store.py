"""The planner's durable store: one SQLite file (WAL) shared by every
service that keeps state across restarts (ClusterService's plans,
PlacementService's lease ledger), each in its own tables.

WAL journal with synchronous=FULL: a change is on disk when the RPC that made
it answers, so a server killed with SIGKILL (or a power cut) restarts with
every answered change. One connection per store, serialized by a lock; a
change runs in one IMMEDIATE transaction, so two servers sharing a file also
see each other's changes whole. No path (or ":memory:") keeps the state in
memory only (`planner call` in process, tests).

Opening checks the file before serving from it: a new store is created
whole under a temporary name and renamed into place (so a file of 0 bytes is
never one of ours and is refused, as is a file written by a newer planner),
and `PRAGMA quick_check` must pass (a corrupt file is refused with what
SQLite found). Once open, a read or write that fails in SQLite (disk full,
I/O error, locked past the busy timeout) is a StoreUnavailableError, and
listeners hear of failures and of the next write that succeeds.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TypeVar

from planner.service.database import Listeners, StoreListener
from planner.service.errors import StoreUnavailableError

T = TypeVar("T")
MEMORY = ":memory:"
# 2: PlacementService's ledger stored per row (version 1 kept one JSON
# document per pool; opening such a file converts it).
SCHEMA_VERSION = 2
BUSY_TIMEOUT_S = 10.0
# quick_check lines quoted in the refusal of a corrupt store.
CORRUPTION_LINES_SHOWN = 3

Migration = Callable[[sqlite3.Connection], None]

_PROBE_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS store_probe (id INTEGER PRIMARY KEY, writes INTEGER NOT NULL)",
)


def _is_store_failure(exc: sqlite3.Error) -> bool:
    """Failures of the file or the disk, not of the statements we send."""
    return isinstance(exc, sqlite3.OperationalError) or type(exc) is sqlite3.DatabaseError


class SqliteDatabase:
    """One connection to the store file, opened on first use, with the
    tables of every service that registered its schema."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path: str = MEMORY if path is None or str(path) in ("", MEMORY) else str(path)
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.RLock()
        self._schemas: dict[str, tuple[tuple[str, ...], Migration | None]] = {}
        self._applied: set[str] = set()
        self._listeners = Listeners()
        self.register_schema("store", _PROBE_SCHEMA)

    @property
    def durable(self) -> bool:
        return self.path != MEMORY

    def add_listener(self, listener: StoreListener) -> None:
        self._listeners.add(listener)

    def register_schema(
        self, name: str, statements: tuple[str, ...], migrate: Migration | None = None
    ) -> None:
        """Tables (CREATE ... IF NOT EXISTS) created on the connection before
        its first use by name's owner, then migrate(conn) (converting what an
        older version stored), in one transaction; idempotent."""
        with self._lock:
            self._schemas.setdefault(name, (statements, migrate))
            if self._conn is not None:
                self._apply(self._conn)

    def open(self) -> None:
        """Open (creating the file and its folder); raises OSError when it
        cannot, or when the file is empty, corrupt or from a newer planner."""
        with self._lock:
            self.connect()

    def connect(self) -> sqlite3.Connection:
        with self._lock:
            if self._conn is not None:
                return self._conn
            try:
                conn = self._connect_checked()
            except (sqlite3.Error, OSError) as exc:
                raise OSError(f"cannot open store {self.path}: {exc}") from exc
            self._conn = conn
            return conn

    def _connect_checked(self) -> sqlite3.Connection:
        if self.durable:
            path = Path(self.path)
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                self._create(path)
            _refuse_empty(path)
        conn = sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        try:
            if self.durable:
                _check_integrity(conn, self.path)
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise sqlite3.OperationalError(f"cannot use WAL journal (got {mode})")
            conn.execute("PRAGMA synchronous=FULL")
            self._applied.clear()
            self._apply(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _create(self, path: Path) -> None:
        """A new, empty store at path, written whole under another name and
        linked into place, so that path never names a half-made file."""
        temporary = path.with_name(f".{path.name}.new-{os.getpid()}-{threading.get_ident()}")
        for leftover in (temporary, Path(f"{temporary}-wal"), Path(f"{temporary}-shm")):
            leftover.unlink(missing_ok=True)
        conn = sqlite3.connect(temporary, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        finally:
            conn.close()
        try:
            fd = os.open(temporary, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            # Another server may have created it first: then use theirs.
            with suppress(FileExistsError):
                os.link(temporary, path)
            _fsync_directory(path.parent)
        finally:
            temporary.unlink(missing_ok=True)

    def _apply(self, conn: sqlite3.Connection) -> None:
        pending = [n for n in self._schemas if n not in self._applied]
        if not pending:
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise sqlite3.DatabaseError(
                    f"written by a newer planner (schema {version}, this one reads up to "
                    f"{SCHEMA_VERSION})"
                )
            for name in pending:
                statements, migrate = self._schemas[name]
                for sql in statements:
                    conn.execute(sql)
                if migrate is not None:
                    migrate(conn)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        self._applied.update(pending)

    # ---- use ---------------------------------------------------------------

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """The connection, held under the store's lock, in a read
        transaction (one consistent snapshot)."""
        try:
            with self._lock:
                conn = self._connection()
                began = False
                try:
                    if not conn.in_transaction:
                        conn.execute("BEGIN")
                        began = True
                    yield conn
                except sqlite3.Error as exc:
                    if not _is_store_failure(exc):
                        raise
                    raise StoreUnavailableError(_reason(exc)) from None
                finally:
                    if began:
                        _rollback(conn)
        except StoreUnavailableError as exc:
            self._tell_failed(exc.reason)
            raise

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction: committed when the block ends, rolled
        back (nothing written) when it raises. A failure of the store itself
        is a StoreUnavailableError; listeners hear of it, and of the next
        transaction that commits."""
        try:
            with self._lock:
                conn = self._connection()
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    yield conn
                    conn.execute("COMMIT")
                except sqlite3.Error as exc:
                    _rollback(conn)
                    if not _is_store_failure(exc):
                        raise
                    raise StoreUnavailableError(_reason(exc)) from None
                except BaseException:
                    _rollback(conn)
                    raise
        except StoreUnavailableError as exc:
            self._tell_failed(exc.reason)
            raise
        self._tell_recovered()

    def run(self, change: Callable[[sqlite3.Connection], T]) -> T:
        """change(conn) inside one transaction."""
        with self.transaction() as conn:
            return change(conn)

    def probe(self) -> None:
        """One small write transaction: raises StoreUnavailableError while the
        store cannot be written."""
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO store_probe (id, writes) VALUES (1, 1) "
                "ON CONFLICT(id) DO UPDATE SET writes = writes + 1"
            )

    def _connection(self) -> sqlite3.Connection:
        try:
            return self.connect()
        except OSError as exc:
            raise StoreUnavailableError(str(exc)) from None

    def _tell_failed(self, reason: str) -> None:
        self._listeners.failed(reason)

    def _tell_recovered(self) -> None:
        self._listeners.recovered()

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
                self._applied.clear()


def _reason(exc: sqlite3.Error) -> str:
    return str(exc) or type(exc).__name__


def _rollback(conn: sqlite3.Connection) -> None:
    # SQLite may have rolled back already (e.g. after SQLITE_FULL).
    if conn.in_transaction:
        with suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def _refuse_empty(path: Path) -> None:
    """A store file is never empty (new ones are created whole), so one of 0
    bytes lost its content; starting an empty store over it would hide that.
    Its WAL may still hold every page, so a non-empty WAL is let through to
    SQLite's own recovery."""
    if path.stat().st_size > 0:
        return
    wal = Path(f"{path}-wal")
    if wal.exists() and wal.stat().st_size > 0:
        return
    raise OSError(
        f"{path} is empty (0 bytes), so it is not a planner store: restore it from a "
        "backup, or delete it to start an empty store"
    )


def _check_integrity(conn: sqlite3.Connection, path: str) -> None:
    try:
        rows = [str(r[0]) for r in conn.execute("PRAGMA quick_check").fetchall()]
    except sqlite3.DatabaseError as exc:
        rows = [_reason(exc)]
    if rows != ["ok"]:
        found = "; ".join(rows[:CORRUPTION_LINES_SHOWN])
        more = f" (and {len(rows) - CORRUPTION_LINES_SHOWN} more)" if len(rows) > 3 else ""
        raise sqlite3.DatabaseError(
            f"{path} is corrupt ({found}{more}): restore it from a backup, or move it "
            "aside to start an empty store"
        )


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
