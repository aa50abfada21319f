"""`planner bench ledger`, writes with replicas: lease ledger write
throughput and latency with 1, 2 and 4 `planner serve` replicas sharing one
PostgreSQL database, next to one replica on a SQLite file.

Each case starts its replicas (real subprocesses) on a fresh store, then
`clients` client processes, each a PlannerClient given every replica's
address (gRPC round robin), offer into a pool of their own (random
producers, a new idempotency key per call) as fast as they are answered for
`duration_s`, all starting at once. Every call is a committed write: fsync
per change on SQLite; on PostgreSQL, a throwaway server with its default
durability (fsync, synchronous commit) unless a URL is given.
"""

from __future__ import annotations

import multiprocessing
import random
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from planner.bench.server_process import ServerProcess
from planner.bench.stats import LatencyStats, summarize
from planner.client import PlannerClient, PlannerError, RetryPolicy
from planner.v1 import placement_pb2 as pb

GB = 10**9
PRODUCERS_PER_POOL = 100
CALL_TIMEOUT_S = 60.0
START_TIMEOUT_S = 120.0
SQLITE = "sqlite"
POSTGRESQL = "postgresql"


@dataclass(frozen=True, slots=True)
class WriteResult:
    store: str
    replicas: int
    clients: int
    duration_s: float
    calls: int
    failed: int
    latency: LatencyStats

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.duration_s

    def to_json(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "replicas": self.replicas,
            "clients": self.clients,
            "duration_s": self.duration_s,
            "calls": self.calls,
            "failed": self.failed,
            "calls_per_s": self.calls_per_s,
            "latency": self.latency.to_json(),
        }


@dataclass(frozen=True, slots=True)
class _ClientJob:
    targets: str
    pool: str
    seed: int
    duration_s: float


def _client(
    job: _ClientJob, start: Barrier, results: multiprocessing.Queue[tuple[list[int], int]]
) -> None:
    """One client process: offers into its pool until duration_s is over."""
    rng = random.Random(job.seed)
    pool = job.pool
    samples: list[int] = []
    failed = 0
    with PlannerClient(
        job.targets, deadline_s=CALL_TIMEOUT_S, retry=RetryPolicy(wait_for_ready=True)
    ) as client:
        n = 0

        def offer() -> None:
            nonlocal n
            n += 1
            client.call(
                "PlacementService.OfferMemory",
                pb.OfferMemoryRequest(
                    pool_id=pool,
                    idempotency_key=f"{pool}-{n}",
                    producer_id=f"producer-{rng.randrange(PRODUCERS_PER_POOL):04d}",
                    bytes=GB,
                ),
            )

        for _ in range(10):  # connections to every replica, warm handlers
            offer()
        start.wait(START_TIMEOUT_S)
        stop = time.perf_counter() + job.duration_s
        while (began := time.perf_counter_ns()) / 1e9 < stop:
            try:
                offer()
            except PlannerError:
                failed += 1
                continue
            samples.append(time.perf_counter_ns() - began)
    results.put((samples, failed))


def measure(
    store: str, location: str, replicas: int, *, clients: int, duration_s: float, seed: int
) -> WriteResult:
    """Starts `replicas` servers on location, runs the clients, stops them."""
    context = multiprocessing.get_context("spawn")
    # Pools (and so keys) of their own, even on a database used before.
    run = f"{store}-{replicas}-{time.time_ns():x}"
    with ExitStack() as stack:
        servers = [
            stack.enter_context(ServerProcess("--store", location, "--log-level", "error"))
            for _ in range(replicas)
        ]
        targets = ",".join(s.address for s in servers)
        start = context.Barrier(clients + 1)
        results: multiprocessing.Queue[tuple[list[int], int]] = context.Queue()
        processes = [
            context.Process(
                target=_client,
                args=(
                    _ClientJob(targets, f"writes-{run}-{k}", seed + k, duration_s),
                    start,
                    results,
                ),
            )
            for k in range(clients)
        ]
        for p in processes:
            p.start()
        try:
            start.wait(START_TIMEOUT_S)
            gathered = [results.get(timeout=duration_s + START_TIMEOUT_S) for _ in processes]
        finally:
            for p in processes:
                p.join(START_TIMEOUT_S)
                if p.is_alive():
                    p.kill()
    samples = [s for mine, _ in gathered for s in mine]
    return WriteResult(
        store=store,
        replicas=replicas,
        clients=clients,
        duration_s=duration_s,
        calls=len(samples),
        failed=sum(f for _, f in gathered),
        latency=summarize(samples),
    )


def run_cases(
    *,
    replica_counts: Sequence[int],
    clients: int,
    duration_s: float,
    seed: int,
    folder: Path,
    postgresql_url: str | None,
    progress: Callable[[str], None],
) -> tuple[list[WriteResult], str | None]:
    """SQLite on one replica, then PostgreSQL with each replica count. The
    second value says why PostgreSQL was left out (None: it was not)."""
    progress(f"writes: SQLite, 1 replica, {clients} clients, {duration_s:g} s")
    results = [
        measure(
            SQLITE,
            str(folder / "writes.sqlite3"),
            1,
            clients=clients,
            duration_s=duration_s,
            seed=seed,
        )
    ]
    with ExitStack() as stack:
        new_database: Callable[[], str]
        if postgresql_url is not None:
            url = postgresql_url
            new_database = lambda: url  # noqa: E731
        else:
            from planner.bench.postgres_server import (  # noqa: PLC0415 - psycopg is optional
                LocalPostgres,
                PostgresUnavailableError,
            )

            try:
                server = stack.enter_context(LocalPostgres(durable=True))
            except PostgresUnavailableError as exc:
                return results, str(exc)
            new_database = server.create_database
        for count in replica_counts:
            progress(f"writes: PostgreSQL, {count} replicas, {clients} clients")
            results.append(
                measure(
                    POSTGRESQL,
                    new_database(),
                    count,
                    clients=clients,
                    duration_s=duration_s,
                    seed=seed + count,
                )
            )
    return results, None
