"""A throwaway PostgreSQL server for tests and benches: a real `postgres`
(Debian's postgresql package, or any install whose initdb and pg_ctl are
found), initialized into a temporary folder and listening on a free
loopback port, run as an unprivileged user when this process is root
(PostgreSQL refuses to run as root), stopped and deleted on close.

Binaries are looked up in $PLANNER_POSTGRES_BIN, then on PATH, then in
/usr/lib/postgresql/<version>/bin (newest first). The superuser `planner`
logs in over TCP with a password (scram-sha-256), so URLs carry one, as in
production.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

import psycopg
from psycopg import sql

BIN_ENV = "PLANNER_POSTGRES_BIN"
DEBIAN_BIN_GLOB = "/usr/lib/postgresql/*/bin"
SUPERUSER = "planner"
PASSWORD = "planner-local-secret"
START_TIMEOUT_S = 60
# Users to run the server as when this process is root, in order.
UNPRIVILEGED_USERS = ("postgres", "nobody")
# Settings of a test server: nothing is flushed to disk (the tests kill
# planner replicas, never the database), small memory.
FAST_SETTINGS = (
    "fsync=off",
    "synchronous_commit=off",
    "full_page_writes=off",
    "shared_buffers=32MB",
)
MAX_CONNECTIONS = 300


class PostgresUnavailableError(RuntimeError):
    """No PostgreSQL server can be started here (the reason says why)."""


def find_binaries() -> Path | None:
    """The folder holding initdb and pg_ctl, or None."""
    candidates: list[Path] = []
    if os.environ.get(BIN_ENV):
        candidates.append(Path(os.environ[BIN_ENV]))
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    debian = sorted(
        Path("/").glob(DEBIAN_BIN_GLOB.lstrip("/")),
        key=lambda p: _version_key(p.parent.name),
        reverse=True,
    )
    candidates.extend(debian)
    for folder in candidates:
        if (folder / "initdb").is_file() and (folder / "pg_ctl").is_file():
            return folder
    return None


def _version_key(name: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in name.split("."))
    except ValueError:
        return (0,)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class LocalPostgres:
    """A running PostgreSQL server; `url(database)` names a database on it.
    durable=True keeps PostgreSQL's default fsync settings (for benches that
    compare with SQLite's fsync per change)."""

    def __init__(self, *, durable: bool = False) -> None:
        binaries = find_binaries()
        if binaries is None:
            raise PostgresUnavailableError(
                "no PostgreSQL server binaries (initdb, pg_ctl) found on PATH, in "
                f"${BIN_ENV} or in {DEBIAN_BIN_GLOB}: install Debian's postgresql package "
                "(make postgresql-server)"
            )
        self.binaries = binaries
        self.durable = durable
        self.folder = Path(tempfile.mkdtemp(prefix="planner-postgres-"))
        self._user = _unprivileged_user()
        self.port = 0
        self._databases = 0
        try:
            self._init()
            self._start()
        except BaseException:
            self._remove()
            raise

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def log(self) -> Path:
        return self.folder / "server.log"

    def _run(self, *command: str) -> None:
        user = self._user
        # setpriv changes the user in the child after exec: a Python-level
        # user= would fork without exec first, and gRPC's fork handlers in
        # a process with live channels can crash that child.
        prefix = (
            []
            if user is None
            else [
                _setpriv(),
                f"--reuid={user.pw_uid}",
                f"--regid={user.pw_gid}",
                "--clear-groups",
                "--",
            ]
        )
        done = subprocess.run(
            [*prefix, *command],
            cwd=self.folder,
            capture_output=True,
            text=True,
            env={**os.environ, "LC_ALL": "C", "PGTZ": "UTC"},
            check=False,
        )
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip()[-2000:]
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise PostgresUnavailableError(
                f"{Path(command[0]).name} failed ({done.returncode}): {tail} {log}".strip()
            )

    def _init(self) -> None:
        password_file = self.folder / "password"
        password_file.write_text(PASSWORD + "\n", encoding="utf-8")
        if self._user is not None:
            os.chown(self.folder, self._user.pw_uid, self._user.pw_gid)
            os.chown(password_file, self._user.pw_uid, self._user.pw_gid)
        self._run(
            str(self.binaries / "initdb"),
            "--pgdata",
            str(self.data),
            "--username",
            SUPERUSER,
            "--pwfile",
            str(password_file),
            "--auth-local",
            "trust",
            "--auth-host",
            "scram-sha-256",
            "--encoding",
            "UTF8",
            "--locale",
            "C",
            "--no-sync",
        )
        password_file.unlink()

    def _start(self) -> None:
        # A port picked free may be taken before the server binds it: try again.
        for attempt in range(3):
            self.port = free_port()
            try:
                self._pg_ctl_start()
                return
            except PostgresUnavailableError:
                if attempt == 2:
                    raise

    def _pg_ctl_start(self) -> None:
        settings = [
            f"port={self.port}",
            "listen_addresses=127.0.0.1",
            f"unix_socket_directories={self.folder}",
            f"max_connections={MAX_CONNECTIONS}",
        ]
        if not self.durable:
            settings += FAST_SETTINGS
        self._run(
            str(self.binaries / "pg_ctl"),
            "--pgdata",
            str(self.data),
            "--log",
            str(self.log),
            "--wait",
            "--timeout",
            str(START_TIMEOUT_S),
            "--options",
            " ".join(f"-c {s}" for s in settings),
            "start",
        )

    def pause(self) -> None:
        """Stops the server (connections are cut), keeping its data."""
        self._pg_ctl_stop("fast")

    def resume(self) -> None:
        """Starts the paused server again on the same port."""
        self._pg_ctl_start()

    def url(self, database: str = "postgres", *, password: str | None = PASSWORD) -> str:
        user = SUPERUSER if password is None else f"{SUPERUSER}:{password}"
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str | None = None) -> str:
        """A new, empty database; its URL."""
        if name is None:
            self._databases += 1
            name = f"planner_{self._databases}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def _pg_ctl_stop(self, mode: str) -> None:
        self._run(
            str(self.binaries / "pg_ctl"),
            "--pgdata",
            str(self.data),
            "--mode",
            mode,
            "--wait",
            "stop",
        )

    def stop(self) -> None:
        """Stops the server and deletes its folder."""
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(PostgresUnavailableError):
                self._pg_ctl_stop("immediate")
        self._remove()

    def _remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _setpriv() -> str:
    found = shutil.which("setpriv")
    if found is None:
        raise PostgresUnavailableError(
            "running as root, and setpriv (util-linux) is not found to run PostgreSQL as "
            "an unprivileged user"
        )
    return found


def _unprivileged_user() -> pwd.struct_passwd | None:
    """The user to run the server as: None when this process is not root."""
    if os.geteuid() != 0:
        return None
    for name in UNPRIVILEGED_USERS:
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise PostgresUnavailableError(
        "running as root, and neither of the users "
        f"{', '.join(UNPRIVILEGED_USERS)} exists to run PostgreSQL as"
    )
