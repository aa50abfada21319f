"""The columns of the lease ledger's producer, lease and reclaim tables, in
the order both store backends (planner.service.ledger_sqlite,
planner.service.ledger_postgres) write and read them, and the number that
orders the lease and reclaim rows."""

from __future__ import annotations

PRODUCER_COLUMNS = (
    "producer_id, server_id, offered_bytes, leased_bytes, offered_total_bytes, returned_total_bytes"
)
LEASE_COLUMNS = (
    "lease_id, producer_id, consumer_id, bytes, state, created_s, reclaim_id, deadline_s"
)
RECLAIM_COLUMNS = (
    "reclaim_id, producer_id, requested_bytes, returned_bytes, requested_s, deadline_s, lease_ids"
)


def record_seq(record_id: str) -> int:
    """The number in "lease-12" or "reclaim-3" (the Ledger makes the ids)."""
    return int(record_id.rsplit("-", 1)[1])
