"""The lease ledger's producer, lease and reclaim rows as both store
backends (planner.service.ledger_sqlite, planner.service.ledger_postgres)
write and read them: each table's columns, a record's values in that order,
the record a row holds, and the number that orders the lease and reclaim
rows. A backend's LedgerRowCodec says how it stores an id (SQLite as
text, PostgreSQL as UTF-8 bytes)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True)
class LedgerRowCodec:
    """A backend's producer, lease and reclaim rows: to_column stores an id,
    of_column reads one back."""

    to_column: IdToColumn
    of_column: IdFromColumn

    def producer_values(self, account: ProducerAccount, lendable_bytes: int) -> Row:
        """PRODUCER_COLUMNS' values, then lendable_bytes."""
        return (
            self.to_column(account.producer_id),
            self.to_column(account.server_id),
            account.offered_bytes,
            account.leased_bytes,
            account.offered_total_bytes,
            account.returned_total_bytes,
            lendable_bytes,
        )

    def lease_values(self, lease: Lease) -> Row:
        """LEASE_COLUMNS' values."""
        return (
            self.to_column(lease.lease_id),
            self.to_column(lease.producer_id),
            self.to_column(lease.consumer_id),
            lease.bytes,
            str(lease.state),
            lease.created_s,
            self.to_column(lease.reclaim_id),
            lease.deadline_s,
        )

    def reclaim_values(self, reclaim: Reclaim) -> Row:
        """RECLAIM_COLUMNS' values."""
        return (
            self.to_column(reclaim.reclaim_id),
            self.to_column(reclaim.producer_id),
            reclaim.requested_bytes,
            reclaim.returned_bytes,
            reclaim.requested_s,
            reclaim.deadline_s,
            json.dumps(reclaim.lease_ids),
        )

    def producer(self, row: Row) -> ProducerAccount:
        """The producer a row of PRODUCER_COLUMNS holds."""
        pid, server, offered, leased, total, returned = row
        return ProducerAccount(
            producer_id=self.of_column(pid),
            server_id=self.of_column(server),
            offered_bytes=column_int(offered),
            leased_bytes=column_int(leased),
            offered_total_bytes=column_int(total),
            returned_total_bytes=column_int(returned),
        )

    def lease(self, row: Row) -> Lease:
        """The lease a row of LEASE_COLUMNS holds."""
        lid, pid, cid, size, state, created, reclaim_id, deadline = row
        return Lease(
            lease_id=self.of_column(lid),
            producer_id=self.of_column(pid),
            consumer_id=self.of_column(cid),
            bytes=column_int(size),
            state=LeaseState(str(state)),
            created_s=column_float(created),
            reclaim_id=self.of_column(reclaim_id),
            deadline_s=column_float(deadline),
        )

    def reclaim(self, row: Row) -> Reclaim:
        """The reclaim a row of RECLAIM_COLUMNS holds."""
        rid, pid, requested, returned, requested_s, deadline, lease_ids = row
        return Reclaim(
            reclaim_id=self.of_column(rid),
            producer_id=self.of_column(pid),
            requested_bytes=column_int(requested),
            requested_s=column_float(requested_s),
            deadline_s=column_float(deadline),
            returned_bytes=column_int(returned),
            lease_ids=[str(x) for x in json.loads(str(lease_ids))],
        )
