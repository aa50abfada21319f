"""PlacementService's lease ledger (DESIGN.md §3.4) in the planner's durable
store, one row per producer, lease, reclaim and answered call
(planner.service.ledger_rows; SQLite in planner.service.ledger_sqlite,
PostgreSQL in planner.service.ledger_postgres).

A mutating call runs in one transaction of its pool: it loads only the rows
the call touches into a pure `Ledger` (the state machine the replay runs
too), applies the call, writes back the rows that changed, and records its
answer under its idempotency key in the same transaction. A crash before
the commit leaves neither, after it both, so an acknowledged call is never
lost and a retry after a crash gets the original answer. Its cost does not
grow with the pool: an allocation picks its producer by one index lookup.

Calls of one pool queue on that pool's lock before they reach the store, so
a busy pool cannot crowd a quiet one out of the store's write lock (on
PostgreSQL, replicas' calls of one pool also queue on the pool's advisory
lock). Each
pool keeps the records of its last KEEP_KEYED_CALLS answered calls (a
retry after that applies again); freed leases leave the pool; completed
reclaims are kept for status up to KEEP_COMPLETED_RECLAIMS per pool.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TypeVar

from google.protobuf.message import Message

from planner.domain.placement import Lease, LeaseState, Reclaim
from planner.policies.aqua.ledger import KEEP_COMPLETED_RECLAIMS, Ledger, LedgerConflictError
from planner.service.convert.placement import (
    DEFAULT_GRACE_S,
    check_allocate,
    check_free,
    check_offer,
    check_reclaim,
    check_status,
)
from planner.service.errors import FailedPreconditionError, InvalidArgumentError
from planner.service.idempotency import request_digest
from planner.service.keyed_locks import KeyedLocks
from planner.service.ledger_rows import (
    LedgerBackend,
    LedgerTransaction,
    PoolCounters,
    PoolRows,
    RecordedCall,
)
from planner.v1 import placement_pb2

R = TypeVar("R", bound=Message)
# The calls that change a pool's ledger, each under its idempotency key.
MutatingRequest = (
    placement_pb2.OfferMemoryRequest
    | placement_pb2.AllocateMemoryRequest
    | placement_pb2.FreeMemoryRequest
    | placement_pb2.ReclaimMemoryRequest
)

# Answered calls remembered per pool for their retries: at 100 calls a
# second into one pool, the last 11 minutes (a few tens of MB on disk).
KEEP_KEYED_CALLS = 65_536
# The proto's byte counters are int64.
MAX_TOTAL_BYTES = (1 << 63) - 1

_STATES = {
    LeaseState.ACTIVE: placement_pb2.LEASE_STATE_ACTIVE,
    LeaseState.REVOKING: placement_pb2.LEASE_STATE_REVOKING,
}

# Loads the rows a call needs from the transaction into the Ledger.
Loader = Callable[[LedgerTransaction, Ledger], None]


def ledger_from_rows(rows: PoolRows) -> Ledger:
    ledger = Ledger()
    ledger.producers = {p.producer_id: p for p in rows.producers}
    ledger.leases = {x.lease_id: x for x in rows.leases}
    ledger.reclaims = {r.reclaim_id: r for r in rows.reclaims}
    ledger.next_lease = rows.counters.next_lease
    ledger.next_reclaim = rows.counters.next_reclaim
    return ledger


def load_producer(
    tx: LedgerTransaction, ledger: Ledger, producer_id: str, *, with_leases: bool = False
) -> None:
    """The producer, its outstanding reclaims and (with_leases) its leases."""
    account = tx.producer(producer_id)
    if account is None:
        return
    ledger.producers[producer_id] = account
    for r in tx.pending_reclaims(producer_id):
        ledger.reclaims[r.reclaim_id] = r
    if with_leases:
        for x in tx.leases_of(producer_id):
            ledger.leases[x.lease_id] = x


class LedgerStore:
    """The lease ledger on a store backend, with one lock per pool."""

    def __init__(self, backend: LedgerBackend, keep_keyed_calls: int = KEEP_KEYED_CALLS) -> None:
        self.backend = backend
        self.keep_keyed_calls = keep_keyed_calls
        self._pools = KeyedLocks()

    def read(self, pool_id: str) -> tuple[Ledger | None, int]:
        rows = self.backend.rows(pool_id)
        if rows is None:
            return None, 0
        return ledger_from_rows(rows), rows.counters.revision

    def mutate(
        self,
        method: str,
        request: MutatingRequest,
        response_type: type[R],
        load: Loader,
        change: Callable[[Ledger, int], R],
    ) -> R:
        """Answers a mutating call once: replays the recorded answer of the
        same (request's pool, idempotency key, content); otherwise loads
        what the call needs (load), applies change(ledger, new revision),
        writes the rows that changed and records the answer, in one
        transaction. load and change may run again if the backend retries
        the transaction."""
        pool_id, key = request.pool_id, request.idempotency_key
        digest = request_digest(method, request)

        def work(tx: LedgerTransaction) -> R:
            recorded = tx.recorded(key)
            if recorded is not None:
                if recorded.method != method or recorded.digest != digest:
                    raise InvalidArgumentError(
                        "idempotency_key",
                        f"{key!r} was used for a different {recorded.method} call in pool "
                        f"{pool_id!r}; use a new key for a new request",
                    )
                replayed = response_type.FromString(recorded.response)
                replayed.replayed = True  # type: ignore[attr-defined]
                return replayed
            counters = tx.counters() or PoolCounters()
            ledger = Ledger()
            ledger.next_lease = counters.next_lease
            ledger.next_reclaim = counters.next_reclaim
            load(tx, ledger)
            before = copy.deepcopy(ledger)
            revision = counters.revision + 1
            try:
                answer = change(ledger, revision)
            except LedgerConflictError as exc:
                raise FailedPreconditionError(exc.field, exc.reason) from None
            _write_changes(tx, before, ledger)
            tx.put_counters(PoolCounters(revision, ledger.next_lease, ledger.next_reclaim))
            if method == "ReclaimMemory":
                tx.prune_completed_reclaims(KEEP_COMPLETED_RECLAIMS)
            tx.record(key, RecordedCall(method, digest, answer.SerializeToString()), revision)
            tx.prune_records(revision - self.keep_keyed_calls)
            return answer

        with self._pools.hold(pool_id):
            return self.backend.transact(pool_id, work)


def _write_changes(tx: LedgerTransaction, before: Ledger, after: Ledger) -> None:
    for pid, account in after.producers.items():
        # Its lendable bytes also move with its reclaims: always rewritten.
        tx.put_producer(account, after.lendable_bytes(pid))
    for lease_id in before.leases.keys() - after.leases.keys():
        tx.delete_lease(lease_id)
    for lease_id, lease in after.leases.items():
        if before.leases.get(lease_id) != lease:
            tx.put_lease(lease)
    for reclaim_id in before.reclaims.keys() - after.reclaims.keys():
        tx.delete_reclaim(reclaim_id)
    for reclaim_id, reclaim in after.reclaims.items():
        if before.reclaims.get(reclaim_id) != reclaim:
            tx.put_reclaim(reclaim)


# ---- messages -------------------------------------------------------------------


def account_to_proto(ledger: Ledger, producer_id: str) -> placement_pb2.ProducerAccount:
    p = ledger.producers[producer_id]
    return placement_pb2.ProducerAccount(
        producer_id=p.producer_id,
        server_id=p.server_id,
        offered_bytes=p.offered_bytes,
        leased_bytes=p.leased_bytes,
        free_bytes=p.free_bytes,
        reclaim_outstanding_bytes=ledger.outstanding_bytes(producer_id),
        offered_total_bytes=p.offered_total_bytes,
        returned_total_bytes=p.returned_total_bytes,
    )


def lease_to_proto(x: Lease) -> placement_pb2.MemoryLease:
    return placement_pb2.MemoryLease(
        lease_id=x.lease_id,
        producer_id=x.producer_id,
        consumer_id=x.consumer_id,
        bytes=x.bytes,
        state=_STATES[x.state],
        created_s=x.created_s,
        reclaim_id=x.reclaim_id,
        deadline_s=x.deadline_s,
    )


def reclaim_to_proto(r: Reclaim) -> placement_pb2.MemoryReclaim:
    return placement_pb2.MemoryReclaim(
        reclaim_id=r.reclaim_id,
        producer_id=r.producer_id,
        requested_bytes=r.requested_bytes,
        returned_bytes=r.returned_bytes,
        outstanding_bytes=r.outstanding_bytes,
        requested_s=r.requested_s,
        deadline_s=r.deadline_s,
        lease_ids=r.lease_ids,
        complete=r.complete,
    )


# ---- handlers ---------------------------------------------------------------------


def offer_memory_rpc(
    msg: placement_pb2.OfferMemoryRequest, store: LedgerStore
) -> placement_pb2.OfferMemoryResponse:
    check_offer(msg)

    def load(tx: LedgerTransaction, ledger: Ledger) -> None:
        load_producer(tx, ledger, msg.producer_id)

    def change(ledger: Ledger, revision: int) -> placement_pb2.OfferMemoryResponse:
        known = ledger.producers.get(msg.producer_id)
        if known is not None and known.offered_total_bytes > MAX_TOTAL_BYTES - msg.bytes:
            raise LedgerConflictError(
                "bytes",
                f"producer {msg.producer_id!r} would have offered more than "
                f"{MAX_TOTAL_BYTES} bytes in all",
            )
        ledger.offer(msg.producer_id, msg.bytes, msg.server_id)
        return placement_pb2.OfferMemoryResponse(
            producer=account_to_proto(ledger, msg.producer_id), revision=revision
        )

    return store.mutate("OfferMemory", msg, placement_pb2.OfferMemoryResponse, load, change)


def allocate_memory_rpc(
    msg: placement_pb2.AllocateMemoryRequest, store: LedgerStore
) -> placement_pb2.AllocateMemoryResponse:
    check_allocate(msg)

    def load(tx: LedgerTransaction, ledger: Ledger) -> None:
        if msg.producer_id:
            load_producer(tx, ledger, msg.producer_id)
            return
        # The producer the Ledger would pick among all candidates is the one
        # that can lend most (ties to the smallest id); when it cannot lend
        # enough, its amount is the "most" the refusal reports.
        best = tx.most_lendable_producer(msg.server_id)
        if best is not None:
            load_producer(tx, ledger, best.producer_id)

    def change(ledger: Ledger, revision: int) -> placement_pb2.AllocateMemoryResponse:
        lease, reason = ledger.allocate(
            msg.consumer_id, msg.bytes, msg.now_s, msg.producer_id, msg.server_id
        )
        out = placement_pb2.AllocateMemoryResponse(
            granted=lease is not None, reason=reason, revision=revision
        )
        if lease is not None:
            out.lease.CopyFrom(lease_to_proto(lease))
            out.producer.CopyFrom(account_to_proto(ledger, lease.producer_id))
        elif msg.producer_id in ledger.producers:
            out.producer.CopyFrom(account_to_proto(ledger, msg.producer_id))
        return out

    return store.mutate("AllocateMemory", msg, placement_pb2.AllocateMemoryResponse, load, change)


def free_memory_rpc(
    msg: placement_pb2.FreeMemoryRequest, store: LedgerStore
) -> placement_pb2.FreeMemoryResponse:
    check_free(msg)

    def load(tx: LedgerTransaction, ledger: Ledger) -> None:
        lease = tx.lease(msg.lease_id)
        if lease is not None:
            ledger.leases[lease.lease_id] = lease
            load_producer(tx, ledger, lease.producer_id)

    def change(ledger: Ledger, revision: int) -> placement_pb2.FreeMemoryResponse:
        lease, returned = ledger.free(msg.lease_id)
        return placement_pb2.FreeMemoryResponse(
            lease=lease_to_proto(lease),
            returned_bytes=returned,
            producer=account_to_proto(ledger, lease.producer_id),
            revision=revision,
        )

    return store.mutate("FreeMemory", msg, placement_pb2.FreeMemoryResponse, load, change)


def reclaim_memory_rpc(
    msg: placement_pb2.ReclaimMemoryRequest, store: LedgerStore
) -> placement_pb2.ReclaimMemoryResponse:
    check_reclaim(msg)
    grace = msg.grace_s if msg.HasField("grace_s") else DEFAULT_GRACE_S

    def load(tx: LedgerTransaction, ledger: Ledger) -> None:
        load_producer(tx, ledger, msg.producer_id, with_leases=True)

    def change(ledger: Ledger, revision: int) -> placement_pb2.ReclaimMemoryResponse:
        r, revoked = ledger.reclaim(msg.producer_id, msg.bytes, msg.now_s, msg.now_s + grace)
        return placement_pb2.ReclaimMemoryResponse(
            reclaim=reclaim_to_proto(r),
            returned_bytes=r.returned_bytes,
            revoked=[lease_to_proto(x) for x in revoked],
            producer=account_to_proto(ledger, msg.producer_id),
            revision=revision,
        )

    return store.mutate("ReclaimMemory", msg, placement_pb2.ReclaimMemoryResponse, load, change)


def get_pool_status_rpc(
    msg: placement_pb2.GetPoolStatusRequest, store: LedgerStore
) -> placement_pb2.GetPoolStatusResponse:
    check_status(msg)
    ledger, revision = store.read(msg.pool_id)
    return pool_status(ledger, revision, msg)


def pool_status(
    ledger: Ledger | None, revision: int, msg: placement_pb2.GetPoolStatusRequest
) -> placement_pb2.GetPoolStatusResponse:
    """The status answer for a pool's whole ledger (None: never written)."""
    out = placement_pb2.GetPoolStatusResponse(found=ledger is not None, revision=revision)
    if ledger is None:
        return out
    out.producers.extend(account_to_proto(ledger, pid) for pid in sorted(ledger.producers))
    leases = sorted(ledger.leases.values(), key=lambda x: int(x.lease_id.rsplit("-", 1)[1]))
    out.leases.extend(
        lease_to_proto(x)
        for x in leases
        if (not msg.producer_id or x.producer_id == msg.producer_id)
        and (not msg.consumer_id or x.consumer_id == msg.consumer_id)
    )
    out.reclaims.extend(reclaim_to_proto(r) for r in ledger.reclaims.values())
    out.overdue_lease_ids.extend(x.lease_id for x in ledger.overdue(msg.now_s))
    return out
