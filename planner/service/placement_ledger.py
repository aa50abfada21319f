"""PlacementService's lease ledger (DESIGN.md §3.4) in the planner's durable
store: each pool's Ledger as one JSON document (table placement_pool) and
every answered mutating call under its idempotency key (table
placement_request), both written in the same IMMEDIATE transaction. A crash
before COMMIT leaves neither; after it, both — so an acknowledged call is
never lost and a retry after a crash gets the original answer.

Freed leases leave the pool document (their answers stay in
placement_request); completed reclaims are kept for status up to
KEEP_COMPLETED_RECLAIMS per pool.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import TypeVar

from google.protobuf.message import Message

from planner.domain.placement import Lease, LeaseState, Reclaim
from planner.policies.aqua.ledger import Ledger, LedgerConflictError
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
from planner.service.store import SqliteDatabase
from planner.v1 import placement_pb2

R = TypeVar("R", bound=Message)

_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS placement_pool (
    pool_id TEXT PRIMARY KEY,
    revision INTEGER NOT NULL,
    state TEXT NOT NULL
)
""",
    """
CREATE TABLE IF NOT EXISTS placement_request (
    pool_id TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    method TEXT NOT NULL,
    digest TEXT NOT NULL,
    response BLOB NOT NULL,
    revision INTEGER NOT NULL,
    PRIMARY KEY (pool_id, idempotency_key)
)
""",
)

_STATES = {
    LeaseState.ACTIVE: placement_pb2.LEASE_STATE_ACTIVE,
    LeaseState.REVOKING: placement_pb2.LEASE_STATE_REVOKING,
}


class LedgerStore:
    """The ledger tables on a shared store connection (ClusterStore.db)."""

    def __init__(self, db: SqliteDatabase) -> None:
        self.db = db
        db.register_schema("placement", _SCHEMA)

    def read(self, pool_id: str) -> tuple[Ledger | None, int]:
        with self.db.reading() as conn:
            row = conn.execute(
                "SELECT state, revision FROM placement_pool WHERE pool_id = ?", (pool_id,)
            ).fetchone()
        if row is None:
            return None, 0
        return Ledger.from_dict(json.loads(row[0])), int(row[1])

    def mutate(
        self,
        method: str,
        *,
        pool_id: str,
        key: str,
        request: Message,
        response_type: type[R],
        change: Callable[[Ledger, int], R],
    ) -> R:
        """Answers a mutating call once: replays the recorded answer of the
        same (pool, key, content); otherwise applies change(ledger, revision)
        and records its answer, in one transaction."""
        digest = request_digest(method, request)
        with self.db.transaction() as conn:
            recorded = conn.execute(
                "SELECT method, digest, response FROM placement_request "
                "WHERE pool_id = ? AND idempotency_key = ?",
                (pool_id, key),
            ).fetchone()
            if recorded is not None:
                if recorded[0] != method or recorded[1] != digest:
                    raise InvalidArgumentError(
                        "idempotency_key",
                        f"{key!r} was used for a different {recorded[0]} call in pool "
                        f"{pool_id!r}; use a new key for a new request",
                    )
                answer = response_type.FromString(recorded[2])
                answer.replayed = True  # type: ignore[attr-defined]
                return answer
            ledger, revision = _load(conn, pool_id)
            try:
                answer = change(ledger, revision + 1)
            except LedgerConflictError as exc:
                raise FailedPreconditionError(exc.field, exc.reason) from None
            conn.execute(
                "INSERT INTO placement_pool (pool_id, revision, state) VALUES (?, ?, ?) "
                "ON CONFLICT(pool_id) DO UPDATE SET revision = excluded.revision, "
                "state = excluded.state",
                (pool_id, revision + 1, json.dumps(ledger.to_dict())),
            )
            conn.execute(
                "INSERT INTO placement_request "
                "(pool_id, idempotency_key, method, digest, response, revision) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (pool_id, key, method, digest, answer.SerializeToString(), revision + 1),
            )
        return answer


def _load(conn: sqlite3.Connection, pool_id: str) -> tuple[Ledger, int]:
    row = conn.execute(
        "SELECT state, revision FROM placement_pool WHERE pool_id = ?", (pool_id,)
    ).fetchone()
    if row is None:
        return Ledger(), 0
    return Ledger.from_dict(json.loads(row[0])), int(row[1])


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

    def change(ledger: Ledger, revision: int) -> placement_pb2.OfferMemoryResponse:
        ledger.offer(msg.producer_id, msg.bytes, msg.server_id)
        return placement_pb2.OfferMemoryResponse(
            producer=account_to_proto(ledger, msg.producer_id), revision=revision
        )

    return store.mutate(
        "OfferMemory",
        pool_id=msg.pool_id,
        key=msg.idempotency_key,
        request=msg,
        response_type=placement_pb2.OfferMemoryResponse,
        change=change,
    )


def allocate_memory_rpc(
    msg: placement_pb2.AllocateMemoryRequest, store: LedgerStore
) -> placement_pb2.AllocateMemoryResponse:
    check_allocate(msg)

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

    return store.mutate(
        "AllocateMemory",
        pool_id=msg.pool_id,
        key=msg.idempotency_key,
        request=msg,
        response_type=placement_pb2.AllocateMemoryResponse,
        change=change,
    )


def free_memory_rpc(
    msg: placement_pb2.FreeMemoryRequest, store: LedgerStore
) -> placement_pb2.FreeMemoryResponse:
    check_free(msg)

    def change(ledger: Ledger, revision: int) -> placement_pb2.FreeMemoryResponse:
        lease, returned = ledger.free(msg.lease_id)
        return placement_pb2.FreeMemoryResponse(
            lease=lease_to_proto(lease),
            returned_bytes=returned,
            producer=account_to_proto(ledger, lease.producer_id),
            revision=revision,
        )

    return store.mutate(
        "FreeMemory",
        pool_id=msg.pool_id,
        key=msg.idempotency_key,
        request=msg,
        response_type=placement_pb2.FreeMemoryResponse,
        change=change,
    )


def reclaim_memory_rpc(
    msg: placement_pb2.ReclaimMemoryRequest, store: LedgerStore
) -> placement_pb2.ReclaimMemoryResponse:
    check_reclaim(msg)
    grace = msg.grace_s if msg.HasField("grace_s") else DEFAULT_GRACE_S

    def change(ledger: Ledger, revision: int) -> placement_pb2.ReclaimMemoryResponse:
        r, revoked = ledger.reclaim(msg.producer_id, msg.bytes, msg.now_s, msg.now_s + grace)
        return placement_pb2.ReclaimMemoryResponse(
            reclaim=reclaim_to_proto(r),
            returned_bytes=r.returned_bytes,
            revoked=[lease_to_proto(x) for x in revoked],
            producer=account_to_proto(ledger, msg.producer_id),
            revision=revision,
        )

    return store.mutate(
        "ReclaimMemory",
        pool_id=msg.pool_id,
        key=msg.idempotency_key,
        request=msg,
        response_type=placement_pb2.ReclaimMemoryResponse,
        change=change,
    )


def get_pool_status_rpc(
    msg: placement_pb2.GetPoolStatusRequest, store: LedgerStore
) -> placement_pb2.GetPoolStatusResponse:
    check_status(msg)
    ledger, revision = store.read(msg.pool_id)
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
