"""The store writes of a lease-ledger call do not grow with its pool: a real
`planner serve --store FILE` is filled with a pool of 10 producers and one
of 1,000, and the bytes the server process writes for one call (its
`wchar` in /proc/PID/io: the WAL frames of the call's transaction) are
compared, median of 20 offers and of 20 allocations into each. A store
that rewrote the whole pool on every call writes about 20 times more into
the big pool (SQLite leaves the unchanged pages of a document of the same
length alone, so the allocations, which add a lease, show it most)."""

from __future__ import annotations

import random
import statistics
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from planner.bench.server_process import ServerProcess
from planner.v1 import placement_pb2 as pb
from planner.v1 import placement_pb2_grpc

SMALL = 10
LARGE = 1_000
CALLS = 20
FILLERS = 4
TIMEOUT_S = 60.0

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/io").is_file(), reason="counts written bytes in /proc/PID/io"
)


def written_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == "wchar":
            return int(value)
    raise AssertionError("no wchar in /proc/PID/io")


def offer(pool: str, producer: int, key: str) -> pb.OfferMemoryRequest:
    return pb.OfferMemoryRequest(
        pool_id=pool,
        idempotency_key=key,
        producer_id=f"producer-{producer:05d}",
        server_id=f"server-{producer % 8}",
        bytes=10**9,
    )


def fill(address: str, pool: str, producers: int) -> None:
    def work(first: int) -> None:
        with grpc.insecure_channel(address) as channel:
            stub = placement_pb2_grpc.PlacementServiceStub(channel)
            for i in range(first, producers, FILLERS):
                stub.OfferMemory(offer(pool, i, f"fill-{i}"), timeout=TIMEOUT_S)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(FILLERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    with ServerProcess(
        "--store", str(tmp_path / "store.sqlite3"), "--log-level", "error"
    ) as process:
        yield process


def bytes_per_call(
    server: ServerProcess, stub: placement_pb2_grpc.PlacementServiceStub, pool: str, size: int
) -> tuple[float, float]:
    """Median bytes the server wrote for one offer and for one allocation
    into pool (the median leaves out the call that happened to checkpoint
    the WAL into the database file)."""
    rng = random.Random(size)
    offers, allocations = [], []
    for k in range(CALLS):
        before = written_bytes(server.pid)
        stub.OfferMemory(offer(pool, rng.randrange(size), f"{pool}-offer-{k}"), timeout=TIMEOUT_S)
        offers.append(written_bytes(server.pid) - before)
    for k in range(CALLS):
        before = written_bytes(server.pid)
        answer = stub.AllocateMemory(
            pb.AllocateMemoryRequest(
                pool_id=pool, idempotency_key=f"{pool}-allocate-{k}", consumer_id="c", bytes=1
            ),
            timeout=TIMEOUT_S,
        )
        allocations.append(written_bytes(server.pid) - before)
        assert answer.granted
    return statistics.median(offers), statistics.median(allocations)


def test_a_call_writes_as_much_into_a_pool_of_1000_producers_as_into_one_of_10(
    server: ServerProcess,
) -> None:
    fill(server.address, "small", SMALL)
    fill(server.address, "large", LARGE)
    with grpc.insecure_channel(server.address) as channel:
        stub = placement_pb2_grpc.PlacementServiceStub(channel)
        small_offer, small_allocate = bytes_per_call(server, stub, "small", SMALL)
        large_offer, large_allocate = bytes_per_call(server, stub, "large", LARGE)
    # A deeper index can cost a page or two more; a pool's document would
    # cost 100 times more (about 170 KB here).
    page = 4096
    assert large_offer <= 1.5 * small_offer + 2 * page, (small_offer, large_offer)
    assert large_allocate <= 1.5 * small_allocate + 2 * page, (small_allocate, large_allocate)
