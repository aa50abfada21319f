"""`planner bench ledger`: PlacementService's lease ledger in a real
`planner serve --store FILE`, as its pools grow.

For each pool size (producers), one pool is filled over gRPC with that many
producers (each offers once), then one client times OfferMemory to random
producers of it and AllocateMemory (any producer, freed right after): the
cost of a call should not depend on the pool's size. Last, `--busy-clients`
unpaced clients offer into the largest pool while one client times offers
into the smallest: a busy pool should not crowd a quiet one out. Every call
carries its own idempotency key and is written to disk (fsync) before it
answers, so the times include the store's writes. Then write throughput
and latency with `--replicas` replicas on one PostgreSQL database, next to
one on SQLite (planner.bench.ledger_replicas).
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from planner.bench.ledger_replicas import WriteResult, run_cases
from planner.bench.machine import describe, load_average, machine_info
from planner.bench.markdown import write_section
from planner.bench.result_options import add_output_options
from planner.bench.server_process import ServerProcess, ServerStartError
from planner.bench.stats import LatencyStats, summarize
from planner.bench.table import markdown_table, text_table
from planner.service.store_location import without_password
from planner.v1 import placement_pb2 as pb
from planner.v1 import placement_pb2_grpc

SECTION = "service:ledger"
BENCH = "ledger"
EXIT_OK = 0
EXIT_FAILED = 1
DEFAULT_PRODUCERS = (10, 100, 1_000, 10_000)
DEFAULT_CALLS = 300
DEFAULT_BUSY_CLIENTS = 8
DEFAULT_REPLICAS = (1, 2, 4)
DEFAULT_WRITE_CLIENTS = 8
DEFAULT_WRITE_DURATION_S = 10.0
SEED_CLIENTS = 4
SERVERS = 8
GB = 10**9
CALL_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class PoolResult:
    producers: int
    seed_s: float
    offer: LatencyStats
    allocate: LatencyStats

    def to_json(self) -> dict[str, Any]:
        return {
            "producers": self.producers,
            "seed_s": self.seed_s,
            "offer": self.offer.to_json(),
            "allocate": self.allocate.to_json(),
        }


@dataclass(frozen=True, slots=True)
class CrowdResult:
    quiet_producers: int
    busy_producers: int
    busy_clients: int
    busy_calls: int
    quiet_offer: LatencyStats

    def to_json(self) -> dict[str, Any]:
        return {
            "quiet_producers": self.quiet_producers,
            "busy_producers": self.busy_producers,
            "busy_clients": self.busy_clients,
            "busy_calls": self.busy_calls,
            "quiet_offer": self.quiet_offer.to_json(),
        }


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(sorted({int(s.replace("_", "")) for s in text.split(",") if s.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError(f"pool sizes must be >= 1: {text!r}")
    return sizes


def _replicas(text: str) -> tuple[int, ...]:
    if text.strip() in ("", "0", "none"):
        return ()
    return _sizes(text)


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def register(benches: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = benches.add_parser(
        "ledger",
        help="lease ledger calls over gRPC as pools grow from 10 to 10,000 producers",
        description=" ".join((__doc__ or "").split("\n\n")[1].split()),
    )
    p.add_argument(
        "--producers",
        type=_sizes,
        default=DEFAULT_PRODUCERS,
        help=f"pool sizes, comma-separated (default {','.join(str(n) for n in DEFAULT_PRODUCERS)})",
    )
    p.add_argument(
        "--calls",
        type=_count,
        default=DEFAULT_CALLS,
        help=f"timed calls of each kind per pool (default {DEFAULT_CALLS})",
    )
    p.add_argument(
        "--busy-clients",
        type=_count,
        default=DEFAULT_BUSY_CLIENTS,
        help=f"clients offering into the largest pool meanwhile (default {DEFAULT_BUSY_CLIENTS})",
    )
    p.add_argument(
        "--replicas",
        type=_replicas,
        default=DEFAULT_REPLICAS,
        help="replica counts on one PostgreSQL database for the write phase, comma-separated "
        f"(default {','.join(str(n) for n in DEFAULT_REPLICAS)}; 'none' skips the phase)",
    )
    p.add_argument(
        "--write-clients",
        type=_count,
        default=DEFAULT_WRITE_CLIENTS,
        help=f"client processes of the write phase (default {DEFAULT_WRITE_CLIENTS})",
    )
    p.add_argument(
        "--write-duration-s",
        type=_seconds,
        default=DEFAULT_WRITE_DURATION_S,
        help=f"seconds each write case runs (default {DEFAULT_WRITE_DURATION_S:g})",
    )
    p.add_argument(
        "--postgresql",
        metavar="URL",
        help="the PostgreSQL database of the write phase (default: a throwaway server with "
        "its default durability, started from Debian's postgresql binaries)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the producers picked")
    add_output_options(p)
    p.set_defaults(func=run)


class _Keys:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._n = 0

    def next(self) -> str:
        with self._lock:
            self._n += 1
            return f"bench-{self._n}"


def _pool(producers: int) -> str:
    return f"pool-{producers}"


def _offer(pool: str, producer: int, key: str) -> pb.OfferMemoryRequest:
    return pb.OfferMemoryRequest(
        pool_id=pool,
        idempotency_key=key,
        producer_id=f"producer-{producer:06d}",
        server_id=f"server-{producer % SERVERS}",
        bytes=GB,
    )


def _fill(address: str, producers: int, keys: _Keys) -> float:
    """Every producer of the pool offers once, from SEED_CLIENTS clients."""
    started = time.perf_counter()
    failures: list[BaseException] = []

    def work(first: int) -> None:
        try:
            with grpc.insecure_channel(address) as channel:
                stub = placement_pb2_grpc.PlacementServiceStub(channel)
                for i in range(first, producers, SEED_CLIENTS):
                    stub.OfferMemory(
                        _offer(_pool(producers), i, keys.next()), timeout=CALL_TIMEOUT_S
                    )
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(SEED_CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]
    return time.perf_counter() - started


def _timed(call: Callable[[], object]) -> int:
    started = time.perf_counter_ns()
    call()
    return time.perf_counter_ns() - started


def measure_pool(
    stub: placement_pb2_grpc.PlacementServiceStub,
    producers: int,
    calls: int,
    rng: random.Random,
    keys: _Keys,
) -> tuple[LatencyStats, LatencyStats]:
    pool = _pool(producers)
    offers = [
        _timed(
            lambda: stub.OfferMemory(
                _offer(pool, rng.randrange(producers), keys.next()), timeout=CALL_TIMEOUT_S
            )
        )
        for _ in range(calls)
    ]
    allocations = [_allocate_and_free(stub, pool, keys) for _ in range(calls)]
    return summarize(offers), summarize(allocations)


def _allocate_and_free(
    stub: placement_pb2_grpc.PlacementServiceStub, pool: str, keys: _Keys
) -> int:
    """Nanoseconds the allocation took; its lease is freed after, untimed."""
    request = pb.AllocateMemoryRequest(
        pool_id=pool, idempotency_key=keys.next(), consumer_id="bench", bytes=GB // 4
    )
    started = time.perf_counter_ns()
    answer = stub.AllocateMemory(request, timeout=CALL_TIMEOUT_S)
    took = time.perf_counter_ns() - started
    if answer.granted:
        stub.FreeMemory(
            pb.FreeMemoryRequest(
                pool_id=pool, idempotency_key=keys.next(), lease_id=answer.lease.lease_id
            ),
            timeout=CALL_TIMEOUT_S,
        )
    return took


def measure_crowding(
    address: str,
    *,
    quiet: int,
    busy: int,
    busy_clients: int,
    calls: int,
    rng: random.Random,
    keys: _Keys,
) -> CrowdResult:
    stop = threading.Event()
    busy_calls = [0] * busy_clients
    failures: list[BaseException] = []

    def hammer(k: int) -> None:
        local = random.Random(k)
        try:
            with grpc.insecure_channel(address) as channel:
                stub = placement_pb2_grpc.PlacementServiceStub(channel)
                while not stop.is_set():
                    stub.OfferMemory(
                        _offer(_pool(busy), local.randrange(busy), keys.next()),
                        timeout=CALL_TIMEOUT_S,
                    )
                    busy_calls[k] += 1
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=hammer, args=(k,)) for k in range(busy_clients)]
    for t in threads:
        t.start()
    try:
        with grpc.insecure_channel(address) as channel:
            stub = placement_pb2_grpc.PlacementServiceStub(channel)
            samples = [
                _timed(
                    lambda: stub.OfferMemory(
                        _offer(_pool(quiet), rng.randrange(quiet), keys.next()),
                        timeout=CALL_TIMEOUT_S,
                    )
                )
                for _ in range(calls)
            ]
    finally:
        stop.set()
        for t in threads:
            t.join()
    if failures:
        raise failures[0]
    return CrowdResult(quiet, busy, busy_clients, sum(busy_calls), summarize(samples))


def _progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    machine = machine_info()
    rng = random.Random(args.seed)
    keys = _Keys()
    pools: list[PoolResult] = []
    crowd: CrowdResult | None = None
    with tempfile.TemporaryDirectory(prefix="planner-bench-ledger-") as folder:
        try:
            server = ServerProcess(
                "--store", str(Path(folder) / "store.sqlite3"), "--log-level", "error"
            )
        except ServerStartError as exc:
            print(f"planner bench ledger: {exc}", file=sys.stderr)
            return EXIT_FAILED
        with server, grpc.insecure_channel(server.address) as channel:
            stub = placement_pb2_grpc.PlacementServiceStub(channel)
            try:
                for producers in args.producers:
                    _progress(f"filling a pool of {producers:,} producers")
                    seed_s = _fill(server.address, producers, keys)
                    _progress(f"timing {args.calls} offers and allocations")
                    offer, allocate = measure_pool(stub, producers, args.calls, rng, keys)
                    pools.append(PoolResult(producers, seed_s, offer, allocate))
                if len(args.producers) > 1:
                    _progress(f"{args.busy_clients} clients busy on the largest pool")
                    crowd = measure_crowding(
                        server.address,
                        quiet=args.producers[0],
                        busy=args.producers[-1],
                        busy_clients=args.busy_clients,
                        calls=args.calls,
                        rng=rng,
                        keys=keys,
                    )
            except grpc.RpcError as exc:
                print(
                    f"planner bench ledger: a call failed: {exc.code().name}: {exc.details()}",
                    file=sys.stderr,
                )
                return EXIT_FAILED
        writes: list[WriteResult] = []
        postgresql_missing: str | None = None
        if args.replicas:
            try:
                writes, postgresql_missing = run_cases(
                    replica_counts=args.replicas,
                    clients=args.write_clients,
                    duration_s=args.write_duration_s,
                    seed=args.seed,
                    folder=Path(folder),
                    postgresql_url=args.postgresql,
                    progress=_progress,
                )
            except ServerStartError as exc:
                print(f"planner bench ledger: {exc}", file=sys.stderr)
                return EXIT_FAILED
            if postgresql_missing is not None:
                _progress(f"writes on PostgreSQL left out: {postgresql_missing}")
    machine["load_avg_1m_at_end"] = load_average()
    report = {
        "bench": BENCH,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command_line(args),
        "machine": machine,
        "pools": [p.to_json() for p in pools],
        "crowding": None if crowd is None else crowd.to_json(),
        "writes": [w.to_json() for w in writes],
        "writes_postgresql_left_out": postgresql_missing,
    }
    print(text_report(pools, crowd))
    if writes:
        print(text_table(WRITE_HEADERS, _write_rows(writes), WRITE_RIGHT))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if args.markdown is not None:
        write_section(
            args.markdown,
            SECTION,
            markdown_section(report, pools, crowd, writes, postgresql_missing),
        )
    return EXIT_OK


def command_line(args: argparse.Namespace) -> str:
    parts = ["planner", "bench", "ledger"]
    if args.producers != DEFAULT_PRODUCERS:
        parts += ["--producers", ",".join(str(n) for n in args.producers)]
    if args.calls != DEFAULT_CALLS:
        parts += ["--calls", str(args.calls)]
    if args.busy_clients != DEFAULT_BUSY_CLIENTS:
        parts += ["--busy-clients", str(args.busy_clients)]
    if args.replicas != DEFAULT_REPLICAS:
        parts += ["--replicas", ",".join(str(n) for n in args.replicas) or "none"]
    if args.write_clients != DEFAULT_WRITE_CLIENTS:
        parts += ["--write-clients", str(args.write_clients)]
    if args.write_duration_s != DEFAULT_WRITE_DURATION_S:
        parts += ["--write-duration-s", f"{args.write_duration_s:g}"]
    if args.postgresql is not None:
        parts += ["--postgresql", without_password(args.postgresql)]
    if args.seed:
        parts += ["--seed", str(args.seed)]
    for flag, path in (("--out", args.out), ("--markdown", args.markdown)):
        if path is not None:
            parts += [flag, str(path)]
    return " ".join(parts)


HEADERS = (
    "producers in pool",
    "fill s",
    "offer p50 ms",
    "offer p99 ms",
    "offer max ms",
    "allocate p50 ms",
    "allocate p99 ms",
    "allocate max ms",
)
RIGHT = set(range(len(HEADERS)))


def _ms(value: float) -> str:
    return f"{value:,.1f}" if value >= 100 else f"{value:.2f}"


def _rows(pools: Sequence[PoolResult]) -> list[list[str]]:
    return [
        [
            f"{p.producers:,}",
            f"{p.seed_s:.1f}",
            _ms(p.offer.p50_ms),
            _ms(p.offer.p99_ms),
            _ms(p.offer.max_ms),
            _ms(p.allocate.p50_ms),
            _ms(p.allocate.p99_ms),
            _ms(p.allocate.max_ms),
        ]
        for p in pools
    ]


def _crowd_line(crowd: CrowdResult | None) -> str:
    if crowd is None:
        return ""
    q = crowd.quiet_offer
    return (
        f"Offers into the {crowd.quiet_producers:,}-producer pool while {crowd.busy_clients} "
        f"clients offered into the {crowd.busy_producers:,}-producer one "
        f"({crowd.busy_calls:,} calls meanwhile): p50 {_ms(q.p50_ms)} ms, p99 "
        f"{_ms(q.p99_ms)} ms, max {_ms(q.max_ms)} ms."
    )


def text_report(pools: Sequence[PoolResult], crowd: CrowdResult | None) -> str:
    table = text_table(HEADERS, _rows(pools), RIGHT)
    return f"{table}\n{_crowd_line(crowd)}".rstrip()


WRITE_HEADERS = (
    "store",
    "replicas",
    "clients",
    "writes/s",
    "p50 ms",
    "p99 ms",
    "max ms",
    "failed",
)
WRITE_RIGHT = set(range(1, len(WRITE_HEADERS)))
_STORE_NAMES = {"sqlite": "SQLite file", "postgresql": "PostgreSQL"}


def _write_rows(writes: Sequence[WriteResult]) -> list[list[str]]:
    return [
        [
            _STORE_NAMES.get(w.store, w.store),
            str(w.replicas),
            str(w.clients),
            f"{w.calls_per_s:,.0f}",
            _ms(w.latency.p50_ms),
            _ms(w.latency.p99_ms),
            _ms(w.latency.max_ms),
            str(w.failed),
        ]
        for w in writes
    ]


def _writes_part(writes: Sequence[WriteResult], postgresql_missing: str | None) -> str:
    if not writes:
        return ""
    w = writes[0]
    text = (
        "### Writes with replicas\n\n"
        f"{w.clients} client processes, each a PlannerClient given every replica (gRPC "
        f"round robin), offer into a pool of their own for {w.duration_s:g} s per case, as "
        "fast as they are answered; every call is a committed write (SQLite: fsync per "
        "change; PostgreSQL: a throwaway server on the same machine with its default "
        "durability, fsync and synchronous commit). Replicas, PostgreSQL and the clients "
        "share the machine's cores.\n\n"
        + markdown_table(WRITE_HEADERS, _write_rows(writes), WRITE_RIGHT)
    )
    if postgresql_missing is not None:
        text += f"\n\nPostgreSQL left out: {postgresql_missing}."
    return text


def markdown_section(
    report: dict[str, Any],
    pools: Sequence[PoolResult],
    crowd: CrowdResult | None,
    writes: Sequence[WriteResult] = (),
    postgresql_missing: str | None = None,
) -> str:
    return "\n\n".join(
        part
        for part in (
            "## Lease ledger: calls as pools grow",
            f"`{report['command']}`, {report['date']}, {describe(report['machine'])}. "
            "One client over gRPC on loopback to a `planner serve --store FILE`; every call "
            "is on disk (fsync) before it answers.",
            markdown_table(HEADERS, _rows(pools), RIGHT),
            _crowd_line(crowd),
            _writes_part(writes, postgresql_missing),
            "The same bench against a server that kept each pool as one JSON document is in "
            "[reliability.md](reliability.md) (attack 5). `make bench` runs this at full "
            "size; `make bench-quick` with pools of 10 and 1,000 producers, 50 calls, 1 and "
            "2 replicas for 3 s, JSON under out/bench-quick/ only.",
        )
        if part
    )
