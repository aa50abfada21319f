"""The lease ledger survives kill -9 in the middle of a burst: a real
`planner serve --store FILE` takes calls from four concurrent clients and is
killed with SIGKILL while calls are in flight. Restarted on the same file:

- every acknowledged call is there: retrying it (same idempotency key)
  answers replayed with the original content;
- nothing is half-applied: each client then retries its unanswered call and
  finishes its sequence, and every producer's accounts equal a pure Ledger
  that ran the client's whole sequence once (each client works on its own
  producer, so the order across clients does not matter)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import grpc

from planner.policies.aqua.ledger import Ledger
from planner.service.cluster_store import ClusterStore
from planner.service.placement_ledger import offer_memory_rpc
from planner.v1 import placement_pb2 as pb
from planner.v1 import placement_pb2_grpc

PLANNER = Path(sys.executable).parent / "planner"
REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 30
GB = 10**9
CLIENTS = 4
STEPS = 40
POOL = "burst"


def serve(store: str, log: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [str(PLANNER), "serve", "--port", "0", "--store", store, "--log-level", "error"],
        stdout=subprocess.PIPE,
        stderr=log.open("a", encoding="utf-8"),
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    first = proc.stdout.readline().strip()
    match = re.fullmatch(r"planner serving on (127\.0\.0\.1:\d+)", first)
    assert match, f"unexpected first line {first!r}"
    return proc, match.group(1)


def sequence(c: int) -> list[tuple[str, dict]]:
    """Client c's calls: offers, allocations and frees on producer p{c}, and a
    reclaim in the middle. Frees name a lease by the index of the
    allocation that made it (resolved when sent)."""
    calls: list[tuple[str, dict]] = [("OfferMemory", {"bytes": 8 * GB})]
    allocs = 0
    for i in range(1, STEPS):
        if i == STEPS // 2:
            calls.append(("ReclaimMemory", {"bytes": 3 * GB, "now_s": float(i)}))
        elif i % 3 == 2 and allocs:
            calls.append(("FreeMemory", {"alloc": allocs - 1}))
        elif i % 7 == 0:
            calls.append(("OfferMemory", {"bytes": GB}))
        else:
            calls.append(("AllocateMemory", {"bytes": GB // 2 * (1 + i % 3), "now_s": float(i)}))
            allocs += 1
    return calls


def request(c: int, k: int, method: str, args: dict, leases: dict[int, str]):
    key = f"c{c}-{k}"
    producer = f"p{c}"
    if method == "OfferMemory":
        return pb.OfferMemoryRequest(
            pool_id=POOL, idempotency_key=key, producer_id=producer, bytes=args["bytes"]
        )
    if method == "AllocateMemory":
        return pb.AllocateMemoryRequest(
            pool_id=POOL,
            idempotency_key=key,
            consumer_id=f"consumer{c}",
            producer_id=producer,
            bytes=args["bytes"],
            now_s=args["now_s"],
        )
    if method == "ReclaimMemory":
        return pb.ReclaimMemoryRequest(
            pool_id=POOL,
            idempotency_key=key,
            producer_id=producer,
            bytes=args["bytes"],
            now_s=args["now_s"],
        )
    lease = leases.get(args["alloc"], "none")
    return pb.FreeMemoryRequest(pool_id=POOL, idempotency_key=key, lease_id=lease)


class Client:
    def __init__(self, c: int) -> None:
        self.c = c
        self.calls = sequence(c)
        self.acked: list[tuple[int, object, object]] = []  # (k, request, answer)
        self.leases: dict[int, str] = {}  # allocation index -> lease id
        self.next = 0
        self.alloc_index = 0

    def run(self, stub, hold: threading.Event | None = None) -> None:
        """Makes the calls left; with hold, waits for it two thirds of the
        way (so no client finishes before the kill)."""
        while self.next < len(self.calls):
            if hold is not None and self.next == len(self.calls) * 2 // 3:
                hold.wait(TIMEOUT_S)
            method, args = self.calls[self.next]
            req = request(self.c, self.next, method, args, self.leases)
            try:
                out = getattr(stub, method)(req, timeout=TIMEOUT_S)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    out = None  # e.g. freeing a lease that was never granted
                else:
                    return  # the server went away: this call's outcome is unknown
            if method == "AllocateMemory":
                if out is not None and out.granted:
                    self.leases[self.alloc_index] = out.lease.lease_id
                self.alloc_index += 1
            if out is not None:
                self.acked.append((self.next, req, out))
            self.next += 1


def expected(c: int) -> Ledger:
    """Client c's whole sequence on a pure ledger."""
    led = Ledger()
    leases: dict[int, str] = {}
    allocs = 0
    for method, args in sequence(c):
        p = f"p{c}"
        if method == "OfferMemory":
            led.offer(p, args["bytes"])
        elif method == "AllocateMemory":
            lease, _ = led.allocate(f"consumer{c}", args["bytes"], args["now_s"], producer_id=p)
            if lease is not None:
                leases[allocs] = lease.lease_id
            allocs += 1
        elif method == "ReclaimMemory":
            led.reclaim(p, args["bytes"], args["now_s"], args["now_s"] + 1.0)
        elif args["alloc"] in leases and leases[args["alloc"]] in led.leases:
            led.free(leases[args["alloc"]])
    return led


def test_kill_9_mid_burst_loses_nothing_acknowledged(tmp_path, store_location):
    store = store_location
    log = tmp_path / "serve.log"
    proc, address = serve(store, log)
    clients = [Client(c) for c in range(CLIENTS)]
    try:
        with grpc.insecure_channel(address) as ch:
            grpc.channel_ready_future(ch).result(timeout=TIMEOUT_S)
            stub = placement_pb2_grpc.PlacementServiceStub(ch)
            killed = threading.Event()
            threads = [threading.Thread(target=cl.run, args=(stub, killed)) for cl in clients]
            for t in threads:
                t.start()
            # Kill once the burst is well under way (calls still in flight).
            while sum(len(cl.acked) for cl in clients) < CLIENTS * STEPS // 3:
                assert proc.poll() is None
                threading.Event().wait(0.002)
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=TIMEOUT_S) == -signal.SIGKILL
            killed.set()
            for t in threads:
                t.join(timeout=TIMEOUT_S)
        assert all(cl.next < len(cl.calls) for cl in clients), "the kill came too late"

        proc, address = serve(store, log)
        with grpc.insecure_channel(address) as ch:
            grpc.channel_ready_future(ch).result(timeout=TIMEOUT_S)
            stub = placement_pb2_grpc.PlacementServiceStub(ch)
            # Every acknowledged call is on disk: its retry replays the answer.
            for cl in clients:
                for _k, req, out in cl.acked:
                    again = getattr(stub, type(req).__name__.removesuffix("Request"))(
                        req, timeout=TIMEOUT_S
                    )
                    assert again.replayed
                    again.replayed = False
                    assert again == out
            # Each client retries its unanswered call (same key) and finishes.
            for cl in clients:
                cl.run(stub)
                assert cl.next == len(cl.calls)
            status = stub.GetPoolStatus(pb.GetPoolStatusRequest(pool_id=POOL), timeout=TIMEOUT_S)
        by_id = {p.producer_id: p for p in status.producers}
        for c in range(CLIENTS):
            want = expected(c).producers[f"p{c}"]
            got = by_id[f"p{c}"]
            assert (got.offered_bytes, got.leased_bytes, got.returned_total_bytes) == (
                want.offered_bytes,
                want.leased_bytes,
                want.returned_total_bytes,
            )
            assert got.leased_bytes <= got.offered_bytes
            live = [x for x in status.leases if x.producer_id == f"p{c}"]
            assert sum(x.bytes for x in live) == got.leased_bytes
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=TIMEOUT_S)


def test_one_store_holds_the_ledger_next_to_cluster_state(store_location):
    """One file (or database), both services' tables."""
    path = store_location
    cluster = ClusterStore(path)
    cluster.update("c", lambda s: ({"n": 1}, None))
    ledger = cluster.ledger
    offer_memory_rpc(
        pb.OfferMemoryRequest(pool_id="p", idempotency_key="k", producer_id="g", bytes=5), ledger
    )
    cluster.close()
    reopened = ClusterStore(path)
    assert reopened.read("c") == ({"n": 1}, 1)
    led, revision = reopened.ledger.read("p")
    assert revision == 1 and led is not None and led.producers["g"].offered_bytes == 5
    reopened.close()
