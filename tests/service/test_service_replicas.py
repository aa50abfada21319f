"""Several `planner serve` replicas on one PostgreSQL database: two, then
four real servers, the clients of test_service_crash_mixed spread across
them (each a PlannerClient given every replica: gRPC round robin), and one
replica killed with kill -9 in the middle of the burst.

- Every acknowledged change is present exactly once: each cluster's
  revision counts every call once and its estimates equal a pure monitor fed
  each observation once; each producer's accounts equal a pure Ledger that
  ran its client's sequence once (the clients' retries of the call the
  killed replica held went to the others, which applied it or replayed it).
- Any answered call re-sent, to any surviving replica, returns its original
  answer (replayed = true).
- The killed replica had been answering calls of the burst (its own
  metrics say so), so the survivors took over a real share of it.

The default run keeps this small (2 ledger and 2 cluster clients, 30
observations); the `slow` variant runs 4 and 4 with 120."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_service_crash_mixed import (
    KILL_AFTER_EACH,
    ClusterClient,
    LedgerClient,
    Progress,
    check_clusters,
    check_ledgers,
)

from planner.client import PlannerClient

PLANNER = Path(sys.executable).parent / "planner"
REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")


class Replica:
    """`planner serve --store URL --port 0 --metrics-port 0` in a subprocess."""

    def __init__(self, url: str, log: Path) -> None:
        self._log = log.open("a", encoding="utf-8")
        self.proc = subprocess.Popen(
            [
                str(PLANNER),
                "serve",
                "--port",
                "0",
                "--metrics-port",
                "0",
                "--store",
                url,
                "--log-level",
                "error",
            ],
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline().strip()
        serving = re.fullmatch(r"planner serving on (127\.0\.0\.1:\d+)", first)
        assert serving, f"unexpected first line {first!r}"
        self.address = serving.group(1)
        second = self.proc.stdout.readline().strip()
        metrics = re.fullmatch(r"metrics on (http://\S+)", second)
        assert metrics, f"unexpected second line {second!r}"
        self.metrics_url = metrics.group(1)

    def calls_started(self, service: str) -> float:
        """grpc_server_started_total of one service, from its /metrics."""
        with urllib.request.urlopen(self.metrics_url, timeout=TIMEOUT_S) as answer:
            text = answer.read().decode()
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "grpc_server_started_total"
            and sample.labels.get("grpc_service") == f"planner.v1.{service}"
        )

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(timeout=TIMEOUT_S) == -signal.SIGKILL

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()


@pytest.fixture
def replicas() -> Iterator[list[Replica]]:
    started: list[Replica] = []
    yield started
    for replica in started:
        replica.close()


def burst_with_a_kill(
    url: str,
    log: Path,
    replicas: list[Replica],
    count: int,
    ledger_clients: int,
    cluster_clients: int,
    observations: int,
) -> None:
    replicas.extend(Replica(url, log) for _ in range(count))
    targets = ",".join(r.address for r in replicas)
    ledgers = [LedgerClient(c) for c in range(ledger_clients)]
    clusters = [ClusterClient(f"cluster{j}", observations) for j in range(cluster_clients)]
    progress = Progress(ledger_clients + cluster_clients)
    threads = [threading.Thread(target=cl.run, args=(targets, progress)) for cl in ledgers]
    threads += [
        threading.Thread(target=cl.run, args=(targets, progress, ledger_clients + j))
        for j, cl in enumerate(clusters)
    ]
    for t in threads:
        t.start()
    try:
        progress.wait_for_each(KILL_AFTER_EACH, threads)
        victim = replicas[0]
        served = victim.calls_started("PlacementService") + victim.calls_started("ClusterService")
        victim.kill9()
    finally:
        progress.killed.set()
        for t in threads:
            t.join(TIMEOUT_S)
    assert not any(t.is_alive() for t in threads)
    assert served > 0, "the killed replica had answered no call of the burst"
    survivors = ",".join(r.address for r in replicas[1:])
    with PlannerClient(survivors, deadline_s=TIMEOUT_S) as client:
        check_clusters(client, clusters)
        check_ledgers(client, ledgers)


@pytest.mark.parametrize("count", [2, 4])
def test_replicas_on_one_database_lose_nothing_when_one_is_killed(
    tmp_path, postgresql_url, replicas, count
):
    burst_with_a_kill(
        postgresql_url,
        tmp_path / "serve.log",
        replicas,
        count,
        ledger_clients=2,
        cluster_clients=2,
        observations=30,
    )


@pytest.mark.slow
@pytest.mark.parametrize("count", [2, 4])
def test_replicas_on_one_database_lose_nothing_when_one_is_killed_long(
    tmp_path, postgresql_url, replicas, count
):
    burst_with_a_kill(
        postgresql_url,
        tmp_path / "serve.log",
        replicas,
        count,
        ledger_clients=4,
        cluster_clients=4,
        observations=120,
    )
