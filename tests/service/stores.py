"""Reading a store's tables directly in tests, whichever database holds
them (ids come back as str from both)."""

from __future__ import annotations

from planner.service.cluster_store import ClusterStore
from planner.service.store import SqliteDatabase

# The store kinds every store suite runs against (tests/conftest.py's
# store_location has the same params).
STORES = ("sqlite", "postgresql")


def rows_of(store: ClusterStore, query: str) -> list[tuple[str, ...]]:
    """The rows a query reads, every value as str (PostgreSQL's BYTEA ids
    decoded from UTF-8)."""
    if isinstance(store.db, SqliteDatabase):
        with store.db.reading() as conn:
            rows = conn.execute(query).fetchall()
    else:
        import psycopg  # noqa: PLC0415 - psycopg is optional (the postgresql extra)

        with psycopg.connect(store.db.url) as conn:  # type: ignore[attr-defined]
            rows = conn.execute(query).fetchall()  # type: ignore[call-overload]
    return [
        tuple(bytes(v).decode() if isinstance(v, bytes | memoryview) else str(v) for v in r)
        for r in rows
    ]
