"""The planner's durable store on a PostgreSQL server, shared by any number
of planner replicas (`planner serve --store postgresql://...`).

Every change runs in one SERIALIZABLE transaction, so replicas changing
the same rows can never both commit what neither would have written alone:
a transaction PostgreSQL cannot serialize is rolled back and run again
(with a short, growing, random wait), up to MAX_ATTEMPTS times. A change
of one pool or cluster first takes a session advisory lock named after it,
so that replicas' calls on the same pool queue instead of aborting each
other; the lock is taken before the transaction begins, so its snapshot
already sees the previous holder's commit. It is released when the
transaction ends, or by the server when the connection dies (a replica
killed with kill -9 holds nothing).

Connections come from a psycopg pool (one per worker thread at most),
unchecked: a pooled connection the server dropped (a restart) fails at the
first statement, before anything was sent that could commit, and the
transaction runs again on another. A failure of the server, the network or
the pool (refused, lost, timed out, read-only, out of disk) is a
StoreUnavailableError with the reason, and listeners hear of it, and of the
next write that commits.

Opening connects once directly (so an unreachable server is reported with
libpq's reason and the URL, without its password), then brings the schema
up to date (planner.service.postgres_schema) under an advisory lock, so
replicas starting together migrate once; a database whose schema is newer
than this planner's is refused.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import psycopg
import psycopg.errors
from psycopg_pool import ConnectionPool, PoolTimeout

from planner.service.database import Listeners, StoreListener
from planner.service.errors import StoreUnavailableError
from planner.service.postgres_schema import LATEST_VERSION, MIGRATIONS, MIGRATIONS_TABLE
from planner.service.store_location import password_of, without_password

T = TypeVar("T")

DEFAULT_POOL_SIZE = 8
CONNECT_TIMEOUT_S = 10
# Longest wait for a pooled connection (all busy, or the server gone); once
# the store is failing, calls give up sooner, until a write commits again.
CONNECTION_WAIT_S = 5.0
FAILING_CONNECTION_WAIT_S = 0.5
# Connecting once more to learn why the pool has no connection.
DIAGNOSE_TIMEOUT_S = 2
# Each connection's session: the longest wait for a row or advisory lock
# (like SQLite's busy timeout), and how long the server keeps a transaction
# its client left open (a planner that hangs).
SESSION_SETTINGS = (
    "SET lock_timeout = '10s'",
    "SET idle_in_transaction_session_timeout = '60s'",
)
MAX_ATTEMPTS = 12
FIRST_BACKOFF_S = 0.001
MAX_BACKOFF_S = 0.05
# Advisory lock namespaces (the first int4 of a two-key lock): "pln" + kind.
LOCK_NAMESPACE_BASE = 0x706C6E00
LEDGER_POOL_LOCK = LOCK_NAMESPACE_BASE + 1
CLUSTER_LOCK = LOCK_NAMESPACE_BASE + 2
MIGRATION_LOCK = LOCK_NAMESPACE_BASE + 3

_BEGIN = "BEGIN ISOLATION LEVEL SERIALIZABLE"
_BEGIN_READ = "BEGIN ISOLATION LEVEL SERIALIZABLE READ ONLY"
# Conflicts PostgreSQL resolves by rolling one transaction back: run it again.
_RETRYABLE = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)


class SchemaTooNewError(Exception):
    pass


class _BrokenBeforeCommitError(Exception):
    """The connection was lost before COMMIT was sent: nothing of the
    transaction can have been committed, so it may run again."""

    def __init__(self, cause: psycopg.Error) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclass(frozen=True, slots=True)
class LockKey:
    """A session advisory lock: a namespace and a name hashed by the server."""

    namespace: int
    name: bytes


def _is_store_failure(exc: psycopg.Error) -> bool:
    """Failures of the server, the connection or the pool, not of the
    statements we send (those are bugs, answered INTERNAL)."""
    return isinstance(exc, psycopg.OperationalError | psycopg.InternalError)


class PostgresDatabase:
    def __init__(self, url: str, pool_size: int = DEFAULT_POOL_SIZE) -> None:
        if pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {pool_size}")
        self.url = url
        self.path = without_password(url)
        self.pool_size = pool_size
        self._password = password_of(url)
        self._lock = threading.Lock()
        self._pool: ConnectionPool | None = None
        self._closed = False
        self._listeners = Listeners()
        self._failing = False
        # Transactions run again after a serialization failure, and after
        # finding their pooled connection dropped by the server.
        self.retries = 0
        self.reconnects = 0

    @property
    def durable(self) -> bool:
        return True

    def add_listener(self, listener: StoreListener) -> None:
        self._listeners.add(listener)

    # ---- opening -------------------------------------------------------------

    def open(self) -> None:
        """Connect, migrate and start the pool; OSError naming the store
        (without its password) when the server cannot be used."""
        self._get_pool()

    def _get_pool(self) -> ConnectionPool:
        with self._lock:
            if self._pool is not None:
                return self._pool
            if self._closed:
                raise OSError(f"store {self.path} is closed")
            try:
                self._migrate()
                pool = ConnectionPool(
                    self.url,
                    min_size=1,
                    max_size=self.pool_size,
                    kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_S},
                    configure=_configure,
                    timeout=CONNECTION_WAIT_S,
                    name="planner-store",
                    open=False,
                )
                pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)
            except (psycopg.Error, SchemaTooNewError) as exc:
                raise OSError(f"cannot open store {self.path}: {self._reason(exc)}") from None
            self._pool = pool
            return pool

    def _migrate(self) -> None:
        with psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
            _configure(conn)
            conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
            try:
                _apply_migrations(conn)
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))

    def _reason(self, exc: BaseException) -> str:
        """The error's message, one line, without the password."""
        text = " ".join(str(exc).split()) or type(exc).__name__
        if self._password:
            text = text.replace(self._password, "***")
        return text

    # ---- use -----------------------------------------------------------------

    def run(
        self,
        work: Callable[[psycopg.Connection], T],
        *,
        lock: LockKey | None = None,
        read_only: bool = False,
    ) -> T:
        """work(conn) inside one SERIALIZABLE transaction (holding lock, if
        given), run again while PostgreSQL cannot serialize it. Committed when
        work returns, rolled back when it raises. A failure of the store is a
        StoreUnavailableError; listeners hear of it, and of the next write
        transaction that commits."""
        try:
            result = self._run_with_retries(work, lock, read_only)
        except StoreUnavailableError as exc:
            self._failing = True
            self._listeners.failed(exc.reason)
            raise
        if not read_only:
            self._failing = False
            self._listeners.recovered()
        return result

    def _run_with_retries(
        self, work: Callable[[psycopg.Connection], T], lock: LockKey | None, read_only: bool
    ) -> T:
        conflicts = 0
        # Every pooled connection may be one the server dropped.
        broken_left = self.pool_size + 1
        while True:
            try:
                return self._attempt(work, lock, read_only)
            except _RETRYABLE as exc:
                conflicts += 1
                if conflicts >= MAX_ATTEMPTS:
                    raise StoreUnavailableError(
                        f"{self._reason(exc)} ({conflicts} attempts)"
                    ) from None
                with self._lock:
                    self.retries += 1
                time.sleep(random.uniform(0, min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2**conflicts)))
            except _BrokenBeforeCommitError as exc:
                broken_left -= 1
                if broken_left <= 0:
                    raise StoreUnavailableError(self._reason(exc.cause)) from None
                with self._lock:
                    self.reconnects += 1
            except PoolTimeout:
                raise StoreUnavailableError(self._why_no_connection()) from None
            except psycopg.Error as exc:
                if not _is_store_failure(exc):
                    raise
                raise StoreUnavailableError(self._reason(exc)) from None

    def _why_no_connection(self) -> str:
        """The pool had no connection to give in time: the server's own
        reason when it refuses a new one."""
        try:
            with psycopg.connect(self.url, connect_timeout=DIAGNOSE_TIMEOUT_S):
                pass
        except psycopg.Error as exc:
            return f"{self.path}: {self._reason(exc)}"
        return f"{self.path}: no free connection in time (pool of {self.pool_size})"

    def _attempt(
        self, work: Callable[[psycopg.Connection], T], lock: LockKey | None, read_only: bool
    ) -> T:
        try:
            pool = self._get_pool()
        except OSError as exc:
            raise StoreUnavailableError(str(exc)) from None
        wait_s = FAILING_CONNECTION_WAIT_S if self._failing else CONNECTION_WAIT_S
        with pool.connection(timeout=wait_s) as conn:
            commit_sent = False
            try:
                if lock is not None:
                    conn.execute(
                        "SELECT pg_advisory_lock(%s, hashtext(encode(%s, 'hex')))",
                        (lock.namespace, lock.name),
                    )
                try:
                    conn.execute(_BEGIN_READ if read_only else _BEGIN)
                    result = work(conn)
                    commit_sent = True
                    conn.execute("COMMIT")
                except BaseException:
                    _rollback(conn)
                    raise
                finally:
                    if lock is not None:
                        _unlock(conn, lock)
            except psycopg.OperationalError as exc:
                if conn.closed and not commit_sent and not isinstance(exc, _RETRYABLE):
                    raise _BrokenBeforeCommitError(exc) from None
                raise
        return result

    def probe(self) -> None:
        def write(conn: psycopg.Connection) -> None:
            conn.execute(
                "INSERT INTO store_probe (id, writes) VALUES (1, 1) "
                "ON CONFLICT (id) DO UPDATE SET writes = store_probe.writes + 1"
            )

        self.run(write)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


def _configure(conn: psycopg.Connection) -> None:
    for setting in SESSION_SETTINGS:
        conn.execute(setting)


def _rollback(conn: psycopg.Connection) -> None:
    if conn.closed or conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        return
    try:
        conn.execute("ROLLBACK")
    except psycopg.Error:
        # The connection is broken: the pool discards it.
        conn.close()


def _unlock(conn: psycopg.Connection, lock: LockKey) -> None:
    """Releases the advisory lock; a connection that cannot is closed, which
    releases it too (and the pool drops the connection)."""
    if conn.closed:
        return
    try:
        conn.execute(
            "SELECT pg_advisory_unlock(%s, hashtext(encode(%s, 'hex')))",
            (lock.namespace, lock.name),
        )
    except psycopg.Error:
        conn.close()


def _apply_migrations(conn: psycopg.Connection) -> None:
    conn.execute(MIGRATIONS_TABLE)
    row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM planner_schema").fetchone()
    current = int(row[0]) if row is not None else 0
    if current > LATEST_VERSION:
        raise SchemaTooNewError(
            f"written by a newer planner (schema {current}, this one reads up to {LATEST_VERSION})"
        )
    for migration in MIGRATIONS:
        if migration.version <= current:
            continue
        with conn.transaction():
            for statement in migration.statements:
                conn.execute(statement)
            conn.execute(
                "INSERT INTO planner_schema (version, description) VALUES (%s, %s)",
                (migration.version, migration.description),
            )
