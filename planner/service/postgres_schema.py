"""The planner's tables in PostgreSQL, created and versioned by the planner
itself: each migration runs once, in its own transaction, and is recorded
in planner_schema (version, description, when). A migration, once
released, never changes; a new version of a table is a new migration.

Ids the clients choose (pools, producers, consumers, servers, leases,
clusters, idempotency keys) are stored as their UTF-8 bytes (BYTEA): a
protobuf string may hold NUL, which PostgreSQL's text cannot, and byte
order is the order Python compares strings in, so ties between producers
break as in the pure Ledger (and in SQLite, which compares text the same
way)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import LiteralString

MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS planner_schema (
    version INTEGER PRIMARY KEY,
    description TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)
"""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    description: str
    statements: tuple[LiteralString, ...]


_INITIAL: tuple[LiteralString, ...] = (
    """
CREATE TABLE store_probe (
    id INTEGER PRIMARY KEY,
    writes BIGINT NOT NULL
)
""",
    """
CREATE TABLE ledger_pool (
    pool_id BYTEA PRIMARY KEY,
    revision BIGINT NOT NULL,
    next_lease BIGINT NOT NULL,
    next_reclaim BIGINT NOT NULL
)
""",
    """
CREATE TABLE ledger_producer (
    pool_id BYTEA NOT NULL,
    producer_id BYTEA NOT NULL,
    server_id BYTEA NOT NULL,
    offered_bytes BIGINT NOT NULL,
    leased_bytes BIGINT NOT NULL,
    offered_total_bytes BIGINT NOT NULL,
    returned_total_bytes BIGINT NOT NULL,
    lendable_bytes BIGINT NOT NULL,
    PRIMARY KEY (pool_id, producer_id)
)
""",
    """
CREATE INDEX ledger_producer_by_lendable
    ON ledger_producer (pool_id, lendable_bytes DESC, producer_id)
""",
    """
CREATE INDEX ledger_producer_by_server
    ON ledger_producer (pool_id, server_id, lendable_bytes DESC, producer_id)
""",
    """
CREATE TABLE ledger_lease (
    pool_id BYTEA NOT NULL,
    lease_id BYTEA NOT NULL,
    seq BIGINT NOT NULL,
    producer_id BYTEA NOT NULL,
    consumer_id BYTEA NOT NULL,
    bytes BIGINT NOT NULL,
    state TEXT NOT NULL,
    created_s DOUBLE PRECISION NOT NULL,
    reclaim_id BYTEA NOT NULL,
    deadline_s DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (pool_id, lease_id)
)
""",
    """
CREATE INDEX ledger_lease_by_producer ON ledger_lease (pool_id, producer_id, seq)
""",
    """
CREATE TABLE ledger_reclaim (
    pool_id BYTEA NOT NULL,
    reclaim_id BYTEA NOT NULL,
    seq BIGINT NOT NULL,
    producer_id BYTEA NOT NULL,
    requested_bytes BIGINT NOT NULL,
    returned_bytes BIGINT NOT NULL,
    requested_s DOUBLE PRECISION NOT NULL,
    deadline_s DOUBLE PRECISION NOT NULL,
    lease_ids TEXT NOT NULL,
    complete BOOLEAN NOT NULL,
    PRIMARY KEY (pool_id, reclaim_id)
)
""",
    """
CREATE INDEX ledger_reclaim_by_producer
    ON ledger_reclaim (pool_id, producer_id, complete, seq)
""",
    """
CREATE INDEX ledger_reclaim_completed ON ledger_reclaim (pool_id, complete, seq)
""",
    """
CREATE TABLE ledger_request (
    pool_id BYTEA NOT NULL,
    idempotency_key BYTEA NOT NULL,
    method TEXT NOT NULL,
    digest TEXT NOT NULL,
    response BYTEA NOT NULL,
    revision BIGINT NOT NULL,
    PRIMARY KEY (pool_id, idempotency_key)
)
""",
    """
CREATE INDEX ledger_request_by_revision ON ledger_request (pool_id, revision)
""",
    """
CREATE TABLE cluster_state (
    cluster_id BYTEA PRIMARY KEY,
    revision BIGINT NOT NULL,
    state TEXT NOT NULL
)
""",
    """
CREATE TABLE cluster_request (
    cluster_id BYTEA NOT NULL,
    idempotency_key BYTEA NOT NULL,
    method TEXT NOT NULL,
    digest TEXT NOT NULL,
    response BYTEA NOT NULL,
    revision BIGINT NOT NULL,
    PRIMARY KEY (cluster_id, idempotency_key)
)
""",
    """
CREATE INDEX cluster_request_by_revision ON cluster_request (cluster_id, revision)
""",
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "lease ledger rows, cluster state, store probe", _INITIAL),
)
LATEST_VERSION = MIGRATIONS[-1].version
