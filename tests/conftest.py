"""Fixtures shared by every test folder: a real PostgreSQL server for the
suites that run against both stores (planner.bench.postgres_server).

Hypothesis runs without its per-example deadline: speed is measured by the
benchmarks, and a deadline only turns a loaded machine into a failure.

Tests that need it skip, saying why, only when no server can be started
here (no binaries: `make postgresql-server` installs Debian's package);
with PLANNER_REQUIRE_POSTGRESQL=1 (CI) they fail instead."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from hypothesis import settings

settings.register_profile("planner", deadline=None)
settings.load_profile("planner")

REQUIRE_ENV = "PLANNER_REQUIRE_POSTGRESQL"
STORES = ("sqlite", "postgresql")  # as tests/service/stores.py


@pytest.fixture(autouse=True)
def state_folder(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `planner serve` a test starts without --store (in process or as a
    subprocess, which inherits the environment) keeps its store in a folder
    of the test's own: never in the user's ~/.local/state, which concurrent
    runs share and which a CI machine's home may not let it write."""
    folder = tmp_path_factory.mktemp("state")
    monkeypatch.delenv("PLANNER_STORE", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(folder))
    return folder


@pytest.fixture(scope="session")
def postgresql() -> Iterator[Any]:
    """A PostgreSQL server for the whole run (LocalPostgres)."""
    # Imported here: the engine tiers' environment has no psycopg.
    try:
        from planner.bench.postgres_server import (  # noqa: PLC0415 - psycopg is optional
            LocalPostgres,
            PostgresUnavailableError,
        )
    except ImportError as exc:
        _unavailable(f"psycopg is not installed ({exc}); install planner[postgresql]")
    try:
        server = LocalPostgres()
    except PostgresUnavailableError as exc:
        _unavailable(str(exc))
    yield server
    server.stop()


def _unavailable(reason: str) -> NoReturn:
    message = f"no PostgreSQL server for this test: {reason}"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{message} (and ${REQUIRE_ENV}=1)", pytrace=False)
    pytest.skip(message)


@pytest.fixture
def postgresql_url(postgresql: Any) -> str:
    """The URL of a new, empty database on the session's server."""
    url: str = postgresql.create_database()
    return url


@pytest.fixture(params=STORES)
def store_location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a test's store lives, once per store kind: a new SQLite file, or
    a new PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "planner.sqlite3")
    url: str = request.getfixturevalue("postgresql_url")
    return url
