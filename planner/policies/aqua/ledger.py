"""The lease ledger of shared GPU memory (AQUA's coordinator, DESIGN.md §3.4),
as an explicit, serializable state machine. The service keeps one `Ledger` per
pool in the durable store and applies each call in one transaction; this
module does no I/O and reads no clock (callers pass now_s).

Accounting per producer: offered_bytes is what it has lent and not got back;
leased_bytes the part leased to consumers; free = offered - leased.

- offer: adds to offered.
- allocate: a lease of `bytes` on one producer with that much free memory
  (the one named, or the one with the most free memory, on the consumer's
  server when given); producers with an outstanding reclaim lend nothing.
  Not enough free memory anywhere is an answer (granted false: the consumer
  uses CPU DRAM), not an error.
- reclaim: the producer asks for `bytes` back (0: everything not already
  being reclaimed). Free memory comes back at once; for the rest, active
  leases are revoked (fewest, smallest sufficient first) and their consumers
  must move the tensors to DRAM by the deadline and free them. Memory a lease
  still holds is never returned.
- free: ends a lease. Its bytes go first to the producer's outstanding
  reclaims (oldest first), the rest back to free memory.

Invariants (`check`): 0 <= leased <= offered per producer, leased equals the
sum of its live leases, revoking bytes cover the outstanding reclaims,
offered = offered_total - returned_total.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from planner.domain.placement import Lease, LeaseState, ProducerAccount, Reclaim

# Completed reclaims kept for status queries (oldest dropped first).
KEEP_COMPLETED_RECLAIMS = 64


class LedgerConflictError(ValueError):
    """The ledger's state does not allow the call (FAILED_PRECONDITION);
    nothing changed."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class Ledger:
    def __init__(self) -> None:
        self.producers: dict[str, ProducerAccount] = {}
        self.leases: dict[str, Lease] = {}
        self.reclaims: dict[str, Reclaim] = {}
        self.next_lease = 1
        self.next_reclaim = 1

    # ---- operations ----------------------------------------------------------

    def offer(self, producer_id: str, bytes_: int, server_id: str = "") -> ProducerAccount:
        if bytes_ < 0:
            raise ValueError("bytes must be >= 0")
        p = self.producers.get(producer_id)
        if p is None:
            p = self.producers[producer_id] = ProducerAccount(producer_id, server_id)
        elif server_id and p.server_id and server_id != p.server_id:
            raise LedgerConflictError(
                "server_id", f"producer {producer_id!r} is on server {p.server_id!r}"
            )
        if server_id:
            p.server_id = server_id
        p.offered_bytes += bytes_
        p.offered_total_bytes += bytes_
        return p

    def allocate(
        self,
        consumer_id: str,
        bytes_: int,
        now_s: float,
        producer_id: str = "",
        server_id: str = "",
    ) -> tuple[Lease | None, str]:
        """A new lease, or None and why not."""
        if bytes_ <= 0:
            raise ValueError("bytes must be > 0")
        if producer_id:
            if producer_id not in self.producers:
                return None, f"producer {producer_id!r} has offered nothing"
            candidates = [self.producers[producer_id]]
        else:
            candidates = [
                p for p in self.producers.values() if not server_id or p.server_id == server_id
            ]
            if not candidates:
                where = f" on server {server_id!r}" if server_id else ""
                return None, f"no producer{where}"
        usable = [
            p
            for p in candidates
            if p.free_bytes >= bytes_ and self.outstanding_bytes(p.producer_id) == 0
        ]
        if not usable:
            best = max((self.lendable_bytes(p.producer_id) for p in candidates), default=0)
            return None, f"no producer has {bytes_} bytes free (most: {best})"
        chosen = min(usable, key=lambda p: (-p.free_bytes, p.producer_id))
        lease = Lease(
            lease_id=f"lease-{self.next_lease}",
            producer_id=chosen.producer_id,
            consumer_id=consumer_id,
            bytes=bytes_,
            created_s=now_s,
        )
        self.next_lease += 1
        self.leases[lease.lease_id] = lease
        chosen.leased_bytes += bytes_
        return lease, ""

    def reclaim(
        self, producer_id: str, bytes_: int, now_s: float, deadline_s: float
    ) -> tuple[Reclaim, list[Lease]]:
        """Returns the reclaim and the leases it revoked."""
        p = self.producers.get(producer_id)
        if p is None:
            raise LedgerConflictError(
                "producer_id", f"producer {producer_id!r} has offered nothing"
            )
        if bytes_ < 0:
            raise ValueError("bytes must be >= 0")
        if deadline_s < now_s:
            raise ValueError("deadline before now")
        reclaimable = p.offered_bytes - self.outstanding_bytes(producer_id)
        if bytes_ == 0:
            bytes_ = reclaimable
        elif bytes_ > reclaimable:
            raise LedgerConflictError(
                "bytes", f"asks {bytes_} bytes back, {reclaimable} are lent and not being reclaimed"
            )
        r = Reclaim(
            reclaim_id=f"reclaim-{self.next_reclaim}",
            producer_id=producer_id,
            requested_bytes=bytes_,
            requested_s=now_s,
            deadline_s=deadline_s,
        )
        self.next_reclaim += 1
        at_once = min(bytes_, p.free_bytes)
        self._return(p, at_once)
        r.returned_bytes = at_once
        # Revoking leases may already cover more than earlier reclaims need.
        spare_revoking = self.revoking_bytes(producer_id) - self.outstanding_bytes(producer_id)
        need = r.outstanding_bytes - spare_revoking
        revoked: list[Lease] = []
        active = sorted(
            (
                x
                for x in self.leases.values()
                if x.producer_id == producer_id and x.state is LeaseState.ACTIVE
            ),
            key=lambda x: (x.bytes, x.lease_id),
        )
        while need > 0:
            big_enough = [x for x in active if x.bytes >= need]
            pick = big_enough[0] if big_enough else active[-1]
            active.remove(pick)
            pick.state = LeaseState.REVOKING
            pick.reclaim_id = r.reclaim_id
            pick.deadline_s = deadline_s
            r.lease_ids.append(pick.lease_id)
            revoked.append(pick)
            need -= pick.bytes
        self.reclaims[r.reclaim_id] = r
        self._prune_reclaims()
        return r, revoked

    def free(self, lease_id: str) -> tuple[Lease, int]:
        """Ends the lease; returns it and the bytes it gave back to its producer."""
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            raise LedgerConflictError("lease_id", f"no live lease {lease_id!r} (freed or unknown)")
        p = self.producers[lease.producer_id]
        p.leased_bytes -= lease.bytes
        give = min(lease.bytes, self.outstanding_bytes(p.producer_id))
        self._return(p, give)
        left = give
        for r in self.pending_reclaims(p.producer_id):
            take = min(left, r.outstanding_bytes)
            r.returned_bytes += take
            left -= take
        return lease, give

    # ---- reading -------------------------------------------------------------

    def pending_reclaims(self, producer_id: str) -> list[Reclaim]:
        return sorted(
            (r for r in self.reclaims.values() if r.producer_id == producer_id and not r.complete),
            key=lambda r: int(r.reclaim_id.rsplit("-", 1)[1]),
        )

    def outstanding_bytes(self, producer_id: str) -> int:
        return sum(r.outstanding_bytes for r in self.pending_reclaims(producer_id))

    def revoking_bytes(self, producer_id: str) -> int:
        return sum(
            x.bytes
            for x in self.leases.values()
            if x.producer_id == producer_id and x.state is LeaseState.REVOKING
        )

    def lendable_bytes(self, producer_id: str) -> int:
        p = self.producers[producer_id]
        return 0 if self.outstanding_bytes(producer_id) else p.free_bytes

    def overdue(self, now_s: float) -> list[Lease]:
        """Revoked leases still held past their deadline."""
        return [
            x
            for x in self.leases.values()
            if x.state is LeaseState.REVOKING and x.deadline_s < now_s
        ]

    def check(self) -> None:
        """Raises AssertionError naming the first broken invariant."""
        leased: dict[str, int] = {}
        for lid, x in self.leases.items():
            assert lid == x.lease_id, f"lease key {lid} != {x.lease_id}"
            assert x.bytes > 0, f"{lid}: bytes {x.bytes}"
            assert x.producer_id in self.producers, f"{lid}: unknown producer"
            leased[x.producer_id] = leased.get(x.producer_id, 0) + x.bytes
        for pid, p in self.producers.items():
            assert 0 <= p.leased_bytes <= p.offered_bytes, (
                f"{pid}: leased {p.leased_bytes} > offered {p.offered_bytes}"
            )
            assert p.leased_bytes == leased.get(pid, 0), f"{pid}: leased != its leases"
            assert p.offered_bytes == p.offered_total_bytes - p.returned_total_bytes, pid
            assert self.revoking_bytes(pid) >= self.outstanding_bytes(pid), f"{pid}: revoking"
        for r in self.reclaims.values():
            assert 0 <= r.returned_bytes <= r.requested_bytes, r.reclaim_id

    # ---- storage -------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "producers": [asdict(p) for p in self.producers.values()],
            "leases": [{**asdict(x), "state": str(x.state)} for x in self.leases.values()],
            "reclaims": [asdict(r) for r in self.reclaims.values()],
            "next_lease": self.next_lease,
            "next_reclaim": self.next_reclaim,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Ledger:
        ledger = cls()
        if not d:
            return ledger
        for p in d.get("producers", []):
            ledger.producers[p["producer_id"]] = ProducerAccount(**p)
        for x in d.get("leases", []):
            lease = Lease(**{**x, "state": LeaseState(x["state"])})
            ledger.leases[lease.lease_id] = lease
        for r in d.get("reclaims", []):
            ledger.reclaims[r["reclaim_id"]] = Reclaim(**{**r, "lease_ids": list(r["lease_ids"])})
        ledger.next_lease = int(d.get("next_lease", 1))
        ledger.next_reclaim = int(d.get("next_reclaim", 1))
        return ledger

    # ---- internals -----------------------------------------------------------

    def _return(self, p: ProducerAccount, bytes_: int) -> None:
        p.offered_bytes -= bytes_
        p.returned_total_bytes += bytes_

    def _prune_reclaims(self) -> None:
        done = [r for r in self.reclaims.values() if r.complete]
        for r in done[: max(0, len(done) - KEEP_COMPLETED_RECLAIMS)]:
            del self.reclaims[r.reclaim_id]
