"""What a store backend implements to hold PlacementService's lease ledger
(DESIGN.md §2, §3.4): one row per producer, lease, reclaim and answered
call, plus one row of counters per pool.

A change of one pool runs in one `LedgerBackend.transact(pool_id, work)`
transaction, isolated from every other change of that pool until it
commits: it reads only the rows the call needs, writes only the rows it
changed, and records the call's answer under its idempotency key in the
same transaction, so a crash leaves both or neither. The cost of a call
therefore does not grow with the pool. A backend may run `work` more than
once (a server database retries a transaction it could not serialize), so
`work` keeps nothing outside the transaction. Backends: SQLite
(planner.service.ledger_sqlite), PostgreSQL
(planner.service.ledger_postgres).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from planner.domain.placement import Lease, ProducerAccount, Reclaim
from planner.service.idempotency import RecordedCall

T = TypeVar("T")
__all__ = [
    "LedgerBackend",
    "LedgerTransaction",
    "PoolCounters",
    "PoolRows",
    "RecordedCall",
]


@dataclass(frozen=True, slots=True)
class PoolCounters:
    """A pool's revision (one per committed change) and the numbers of its
    next lease and reclaim ids."""

    revision: int = 0
    next_lease: int = 1
    next_reclaim: int = 1


@dataclass(slots=True)
class PoolRows:
    """Every row of one pool: producers by id, leases and reclaims in the
    order they were made."""

    counters: PoolCounters
    producers: list[ProducerAccount] = field(default_factory=list)
    leases: list[Lease] = field(default_factory=list)
    reclaims: list[Reclaim] = field(default_factory=list)


class LedgerTransaction(Protocol):
    """One pool's rows inside one transaction. Reads see the transaction's
    own writes; nothing is visible elsewhere before it commits."""

    def counters(self) -> PoolCounters | None: ...

    def producer(self, producer_id: str) -> ProducerAccount | None: ...

    def most_lendable_producer(self, server_id: str) -> ProducerAccount | None:
        """Of the pool's producers (on server_id, unless it is ""), the one
        with the largest lendable_bytes as last put, ties to the smallest
        producer_id; None when there is none."""
        ...

    def pending_reclaims(self, producer_id: str) -> list[Reclaim]: ...

    def leases_of(self, producer_id: str) -> list[Lease]: ...

    def lease(self, lease_id: str) -> Lease | None: ...

    def recorded(self, key: str) -> RecordedCall | None: ...

    def put_counters(self, counters: PoolCounters) -> None: ...

    def put_producer(self, account: ProducerAccount, lendable_bytes: int) -> None:
        """Insert or replace; lendable_bytes is what it can lend now (its free
        bytes, or 0 while a reclaim of it is outstanding)."""
        ...

    def put_lease(self, lease: Lease) -> None: ...

    def delete_lease(self, lease_id: str) -> None: ...

    def put_reclaim(self, reclaim: Reclaim) -> None: ...

    def delete_reclaim(self, reclaim_id: str) -> None: ...

    def prune_completed_reclaims(self, keep: int) -> None:
        """Drops all but the newest `keep` completed reclaims."""
        ...

    def record(self, key: str, call: RecordedCall, revision: int) -> None: ...

    def prune_records(self, up_to_revision: int) -> None:
        """Drops the records of calls answered at revision <= up_to_revision."""
        ...


class LedgerBackend(Protocol):
    def transact(self, pool_id: str, work: Callable[[LedgerTransaction], T]) -> T:
        """work(tx) in a transaction on pool_id, committed when it returns,
        writing nothing when it raises; what it returns. Store failures raise
        StoreUnavailableError."""
        ...

    def rows(self, pool_id: str) -> PoolRows | None:
        """Every row of the pool, read in one consistent snapshot; None when
        the pool has never been written."""
        ...
