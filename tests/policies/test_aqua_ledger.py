"""The lease ledger's state machine (planner.policies.aqua.ledger) and its
durable store: worked cases, then hypothesis state machines that check the
invariants after every step of random call sequences, and that retries
(same idempotency key) answer the same and change nothing."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from planner.domain.placement import LeaseState
from planner.policies.aqua.ledger import Ledger, LedgerConflictError
from planner.service.cluster_store import ClusterStore
from planner.service.errors import FailedPreconditionError, InvalidArgumentError
from planner.service.placement_ledger import (
    LedgerStore,
    allocate_memory_rpc,
    free_memory_rpc,
    get_pool_status_rpc,
    offer_memory_rpc,
    reclaim_memory_rpc,
)
from planner.v1 import placement_pb2 as pb

GB = 10**9


def test_offer_allocate_free_accounting():
    led = Ledger()
    led.offer("p0", 10 * GB, "s0")
    led.offer("p1", 4 * GB, "s0")
    lease, why = led.allocate("c0", 6 * GB, 1.0)
    assert lease is not None and why == ""
    assert lease.producer_id == "p0"  # the most free memory
    assert led.producers["p0"].free_bytes == 4 * GB
    none, why = led.allocate("c1", 5 * GB, 1.0)
    assert none is None and "no producer has" in why
    # Named producer, and by server.
    assert led.allocate("c1", 5 * GB, 1.0, producer_id="p1")[0] is None
    assert led.allocate("c1", 4 * GB, 1.0, server_id="s1")[0] is None
    second, _ = led.allocate("c1", 4 * GB, 1.0, server_id="s0")
    assert second is not None and second.lease_id == "lease-2"
    assert second.producer_id == "p0"  # 4 GB free on both: ties go by id
    led.check()
    freed, returned = led.free(lease.lease_id)
    assert freed is lease and returned == 0
    assert led.producers["p0"].free_bytes == 6 * GB
    with pytest.raises(LedgerConflictError, match="no live lease"):
        led.free(lease.lease_id)
    led.check()


def test_reclaim_returns_free_memory_at_once_and_revokes_the_rest():
    led = Ledger()
    led.offer("p", 20 * GB)
    a, _ = led.allocate("c1", 4 * GB, 0.0)
    b, _ = led.allocate("c2", 7 * GB, 0.0)
    c, _ = led.allocate("c3", 3 * GB, 0.0)
    assert a and b and c
    # 6 GB free; asking 10 GB back returns 6 at once and revokes the smallest
    # lease covering the 4 GB left (a, 4 GB), not b.
    r, revoked = led.reclaim("p", 10 * GB, now_s=5.0, deadline_s=6.0)
    assert r.returned_bytes == 6 * GB and r.outstanding_bytes == 4 * GB
    assert [x.lease_id for x in revoked] == [a.lease_id]
    assert a.state is LeaseState.REVOKING and a.deadline_s == 6.0
    p = led.producers["p"]
    assert p.offered_bytes == 14 * GB and p.leased_bytes == 14 * GB and p.free_bytes == 0
    # Nothing is lent while a reclaim is outstanding.
    assert led.allocate("c4", 1, 5.0)[0] is None
    assert [x.lease_id for x in led.overdue(6.5)] == [a.lease_id]
    led.check()
    # Freeing an active lease first answers the reclaim too.
    _, returned = led.free(c.lease_id)
    assert returned == 3 * GB and r.outstanding_bytes == 1 * GB
    _, returned = led.free(a.lease_id)
    assert returned == 1 * GB and r.complete
    assert p.offered_bytes == 10 * GB and p.leased_bytes == 7 * GB
    assert p.returned_total_bytes == 10 * GB
    led.check()
    with pytest.raises(LedgerConflictError, match="asks"):
        led.reclaim("p", 11 * GB, 7.0, 8.0)
    r2, revoked2 = led.reclaim("p", 0, 7.0, 8.0)  # everything
    assert r2.requested_bytes == 10 * GB and r2.returned_bytes == 3 * GB
    assert [x.lease_id for x in revoked2] == [b.lease_id]
    led.check()


def test_round_trip_through_dict():
    led = Ledger()
    led.offer("p", 8 * GB, "s")
    x, _ = led.allocate("c", 5 * GB, 1.0)
    led.reclaim("p", 6 * GB, 2.0, 3.0)
    again = Ledger.from_dict(led.to_dict())
    assert again.to_dict() == led.to_dict()
    assert x is not None and again.leases[x.lease_id].state is LeaseState.REVOKING


PRODUCERS = st.sampled_from(["p0", "p1", "p2"])
SIZES = st.integers(min_value=1, max_value=12).map(lambda k: k * GB // 4)


class LedgerMachine(RuleBasedStateMachine):
    """Random call sequences on the pure ledger; invariants after each step,
    plus 'no memory returned while leased' checked from the outside: what a
    producer got back never exceeds what it lent minus what is leased."""

    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.led = Ledger()
        self.now = 0.0
        self.seen_ids: set[str] = set()
        self.lent: dict[str, int] = {}
        self.freed: list[str] = []
        self.asked: dict[str, int] = {}

    @rule(p=PRODUCERS, size=SIZES)
    def offer(self, p, size):
        self.led.offer(p, size)
        self.lent[p] = self.lent.get(p, 0) + size

    @rule(
        target=leases, c=st.sampled_from(["c0", "c1"]), size=SIZES, named=st.booleans(), p=PRODUCERS
    )
    def allocate(self, c, size, named, p):
        self.now += 1
        before = {k: v.free_bytes for k, v in self.led.producers.items()}
        lease, _ = self.led.allocate(c, size, self.now, producer_id=p if named else "")
        if lease is None:
            return None
        assert lease.lease_id not in self.seen_ids  # no double allocation
        self.seen_ids.add(lease.lease_id)
        assert before[lease.producer_id] >= size
        return lease.lease_id

    @rule(lease_id=consumes(leases))
    def free(self, lease_id):
        if lease_id is None:
            return
        self.led.free(lease_id)
        self.freed.append(lease_id)

    @precondition(lambda self: bool(self.freed))
    @rule(i=st.integers(min_value=0, max_value=100))
    def free_twice_is_refused(self, i):
        with pytest.raises(LedgerConflictError):
            self.led.free(self.freed[i % len(self.freed)])

    @precondition(lambda self: bool(self.led.producers))
    @rule(p=PRODUCERS, size=st.integers(min_value=0, max_value=16).map(lambda k: k * GB // 4))
    def reclaim(self, p, size):
        self.now += 1
        if p not in self.led.producers:
            with pytest.raises(LedgerConflictError):
                self.led.reclaim(p, size, self.now, self.now + 1)
            return
        acct = self.led.producers[p]
        leased_before = {x.lease_id for x in self.led.leases.values() if x.producer_id == p}
        try:
            r, revoked = self.led.reclaim(p, size, self.now, self.now + 1)
        except LedgerConflictError:
            assert size > acct.offered_bytes - self.led.outstanding_bytes(p)
            return
        assert {x.lease_id for x in revoked} <= leased_before
        self.asked[p] = self.asked.get(p, 0) + r.requested_bytes
        assert r.returned_bytes <= r.requested_bytes

    @invariant()
    def consistent(self):
        self.led.check()
        for p, acct in self.led.producers.items():
            assert acct.returned_total_bytes <= self.lent[p] - acct.leased_bytes
            # Memory goes back to a producer only when it asked for it.
            assert acct.returned_total_bytes <= self.asked.get(p, 0)
            pending = sum(r.outstanding_bytes for r in self.led.pending_reclaims(p))
            assert acct.returned_total_bytes + pending == self.asked.get(p, 0)


LedgerMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLedgerMachine = LedgerMachine.TestCase


class StoreMachine(RuleBasedStateMachine):
    """The same through the durable store's handlers (in-memory SQLite, or a
    PostgreSQL database shared by the examples, each on a pool of its own):
    every call carries a key; retrying an earlier call answers the same bytes
    (replayed) and leaves the pool unchanged; reusing a key for other content
    is INVALID_ARGUMENT; refused calls change nothing."""

    def __init__(self, open_store: Callable[[], ClusterStore] = ClusterStore) -> None:
        super().__init__()
        self.cluster_store = open_store()
        self.store: LedgerStore = self.cluster_store.ledger
        self.pool = f"pool-{next(_pools)}"
        self.n = 0
        self.done: list[tuple[object, object]] = []  # (request, answer)
        self.live: list[str] = []

    def _key(self) -> str:
        self.n += 1
        return f"k{self.n}"

    def _call(self, fn, req):
        before = get_pool_status_rpc(pb.GetPoolStatusRequest(pool_id=self.pool), self.store)
        try:
            out = fn(req, self.store)
        except FailedPreconditionError:
            after = get_pool_status_rpc(pb.GetPoolStatusRequest(pool_id=self.pool), self.store)
            assert after == before
            return None
        assert not out.replayed
        self.done.append((fn, req, out))
        return out

    @rule(p=PRODUCERS, size=SIZES)
    def offer(self, p, size):
        self._call(
            offer_memory_rpc,
            pb.OfferMemoryRequest(
                pool_id=self.pool, idempotency_key=self._key(), producer_id=p, bytes=size
            ),
        )

    @rule(size=SIZES)
    def allocate(self, size):
        out = self._call(
            allocate_memory_rpc,
            pb.AllocateMemoryRequest(
                pool_id=self.pool, idempotency_key=self._key(), consumer_id="c", bytes=size
            ),
        )
        if out is not None and out.granted:
            self.live.append(out.lease.lease_id)

    @precondition(lambda self: bool(self.live))
    @rule(i=st.integers(min_value=0, max_value=100))
    def free(self, i):
        lease_id = self.live.pop(i % len(self.live))
        self._call(
            free_memory_rpc,
            pb.FreeMemoryRequest(pool_id=self.pool, idempotency_key=self._key(), lease_id=lease_id),
        )

    @rule(p=PRODUCERS, size=st.integers(min_value=0, max_value=8).map(lambda k: k * GB // 4))
    def reclaim(self, p, size):
        self._call(
            reclaim_memory_rpc,
            pb.ReclaimMemoryRequest(
                pool_id=self.pool, idempotency_key=self._key(), producer_id=p, bytes=size, now_s=1.0
            ),
        )

    @precondition(lambda self: bool(self.done))
    @rule(i=st.integers(min_value=0, max_value=1000))
    def retry(self, i):
        fn, req, first = self.done[i % len(self.done)]
        before = get_pool_status_rpc(pb.GetPoolStatusRequest(pool_id=self.pool), self.store)
        again = fn(req, self.store)
        assert again.replayed
        again.replayed = False
        assert again == first
        after = get_pool_status_rpc(pb.GetPoolStatusRequest(pool_id=self.pool), self.store)
        assert after == before

    @precondition(lambda self: bool(self.done))
    @rule(i=st.integers(min_value=0, max_value=1000))
    def reuse_key_for_other_content(self, i):
        fn, req, _ = self.done[i % len(self.done)]
        other = type(req)()
        other.CopyFrom(req)
        if isinstance(other, pb.FreeMemoryRequest):
            other.lease_id += "x"
        else:
            other.producer_id += "x"
        with pytest.raises(InvalidArgumentError, match="idempotency_key"):
            fn(other, self.store)

    @invariant()
    def consistent(self):
        ledger, _ = self.store.read(self.pool)
        if ledger is not None:
            ledger.check()
            assert set(self.live) <= set(ledger.leases)

    def teardown(self):
        self.cluster_store.close()


_pools = itertools.count()
STORE_MACHINE_SETTINGS = settings(
    max_examples=30,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
StoreMachine.TestCase.settings = STORE_MACHINE_SETTINGS
TestStoreMachine = StoreMachine.TestCase


def test_store_machine_on_postgresql(postgresql_url):
    run_state_machine_as_test(
        lambda: StoreMachine(lambda: ClusterStore(postgresql_url, pool_size=2)),
        settings=STORE_MACHINE_SETTINGS,
    )
