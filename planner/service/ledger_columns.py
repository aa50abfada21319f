"""The lease ledger's producer, lease and reclaim rows as both store
backends (planner.service.ledger_sqlite, planner.service.ledger_postgres)
write and read them: each table's columns, a record's values in that order,
the record a row holds, and the number that orders the lease and reclaim
rows. A backend says how it stores an id (SQLite as text, PostgreSQL as
UTF-8 bytes)."""

from __future__ import annotations

import json
from collections.abc import Callable

from planner.domain.placement import Lease, LeaseState, ProducerAccount, Reclaim

Row = tuple[object, ...]
# An id as the backend stores it, and back.
IdToColumn = Callable[[str], object]
IdFromColumn = Callable[[object], str]

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


def column_int(value: object) -> int:
    assert isinstance(value, int), type(value)
    return value


def column_float(value: object) -> float:
    assert isinstance(value, float | int), type(value)
    return float(value)


def producer_values(account: ProducerAccount, lendable_bytes: int, to_column: IdToColumn) -> Row:
    """PRODUCER_COLUMNS' values, then lendable_bytes."""
    return (
        to_column(account.producer_id),
        to_column(account.server_id),
        account.offered_bytes,
        account.leased_bytes,
        account.offered_total_bytes,
        account.returned_total_bytes,
        lendable_bytes,
    )


def lease_values(lease: Lease, to_column: IdToColumn) -> Row:
    """LEASE_COLUMNS' values."""
    return (
        to_column(lease.lease_id),
        to_column(lease.producer_id),
        to_column(lease.consumer_id),
        lease.bytes,
        str(lease.state),
        lease.created_s,
        to_column(lease.reclaim_id),
        lease.deadline_s,
    )


def reclaim_values(reclaim: Reclaim, to_column: IdToColumn) -> Row:
    """RECLAIM_COLUMNS' values."""
    return (
        to_column(reclaim.reclaim_id),
        to_column(reclaim.producer_id),
        reclaim.requested_bytes,
        reclaim.returned_bytes,
        reclaim.requested_s,
        reclaim.deadline_s,
        json.dumps(reclaim.lease_ids),
    )


def producer_of_row(row: Row, of_column: IdFromColumn) -> ProducerAccount:
    """The producer a row of PRODUCER_COLUMNS holds."""
    pid, server, offered, leased, total, returned = row
    return ProducerAccount(
        producer_id=of_column(pid),
        server_id=of_column(server),
        offered_bytes=column_int(offered),
        leased_bytes=column_int(leased),
        offered_total_bytes=column_int(total),
        returned_total_bytes=column_int(returned),
    )


def lease_of_row(row: Row, of_column: IdFromColumn) -> Lease:
    """The lease a row of LEASE_COLUMNS holds."""
    lid, pid, cid, size, state, created, reclaim_id, deadline = row
    return Lease(
        lease_id=of_column(lid),
        producer_id=of_column(pid),
        consumer_id=of_column(cid),
        bytes=column_int(size),
        state=LeaseState(str(state)),
        created_s=column_float(created),
        reclaim_id=of_column(reclaim_id),
        deadline_s=column_float(deadline),
    )


def reclaim_of_row(row: Row, of_column: IdFromColumn) -> Reclaim:
    """The reclaim a row of RECLAIM_COLUMNS holds."""
    rid, pid, requested, returned, requested_s, deadline, lease_ids = row
    return Reclaim(
        reclaim_id=of_column(rid),
        producer_id=of_column(pid),
        requested_bytes=column_int(requested),
        requested_s=column_float(requested_s),
        deadline_s=column_float(deadline),
        returned_bytes=column_int(returned),
        lease_ids=[str(x) for x in json.loads(str(lease_ids))],
    )
