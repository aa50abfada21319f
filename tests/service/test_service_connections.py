"""Idle connections cannot starve a real `planner serve` of file descriptors.

Sockets that connect and never send a byte each hold a descriptor in the
server before any handshake or token. Started with a soft open-file limit of
1,024, the server raises it to the hard limit, so 2,000 such sockets leave a
normal call answered at once; with a connection cap the server never holds
more than the cap, drops the idle ones after the handshake timeout, and a
waiting client gets in."""

from __future__ import annotations

import os
import re
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from planner.service.connections import RESERVED_FDS
from planner.v1 import info_pb2, info_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[2]
IDLE_SOCKETS = 2_000
START_SOFT_LIMIT = 1_024

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc"
)


def with_open_file_limit(soft: int, hard: int | None, *command: str) -> list[str]:
    """command, run by a Python that first sets RLIMIT_NOFILE (like
    `ulimit -n` in a shell) and then execs it."""
    _, current_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limits = (soft, current_hard if hard is None else hard)
    code = (
        "import os, resource, sys; "
        f"resource.setrlimit(resource.RLIMIT_NOFILE, {limits!r}); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    return [sys.executable, "-c", code, *command]


@contextmanager
def serve(*extra: str, soft_limit: int) -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc = subprocess.Popen(
        with_open_file_limit(
            soft_limit,
            None,
            sys.executable,
            "-m",
            "planner.cli",
            "serve",
            "--port",
            "0",
            "--store",
            ":memory:",
            "--log-level",
            "error",
            *extra,
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=REPO_ROOT,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().strip()
        match = re.fullmatch(r"planner serving on (127\.0\.0\.1:\d+)", first)
        assert match, f"unexpected first line {first!r}"
        yield proc, match.group(1)
    finally:
        proc.kill()
        proc.wait()


@contextmanager
def idle_sockets(address: str, count: int) -> Iterator[list[socket.socket]]:
    """count TCP connections to address that never send a byte."""
    host, port = address.rsplit(":", 1)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = count + 256
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sockets.append(socket.create_connection((host, int(port)), timeout=10))
        yield sockets
    finally:
        for s in sockets:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def closed_by_peer(sock: socket.socket, timeout_s: float) -> bool:
    """Reads (the server's HTTP/2 settings, if any) until the server closes."""
    sock.settimeout(timeout_s)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return True


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def planner_info(address: str, timeout_s: float, *, wait_for_ready: bool = False) -> float:
    """Seconds GetPlannerInfo took; raises grpc.RpcError when it fails."""
    options = [("grpc.max_reconnect_backoff_ms", 250), ("grpc.initial_reconnect_backoff_ms", 50)]
    started = time.monotonic()
    with grpc.insecure_channel(address, options=options) as channel:
        stub = info_pb2_grpc.PlannerInfoServiceStub(channel)
        answer = stub.GetPlannerInfo(
            info_pb2.GetPlannerInfoRequest(), timeout=timeout_s, wait_for_ready=wait_for_ready
        )
    assert answer.version
    return time.monotonic() - started


def test_idle_sockets_do_not_stop_a_normal_call() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * IDLE_SOCKETS + 2 * RESERVED_FDS
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"the hard open-file limit {hard} is below the {need} this test needs")
    with (
        serve(soft_limit=START_SOFT_LIMIT) as (proc, address),
        idle_sockets(address, IDLE_SOCKETS),
    ):
        soft_now, _ = resource.prlimit(proc.pid, resource.RLIMIT_NOFILE)
        assert soft_now > START_SOFT_LIMIT
        took = planner_info(address, timeout_s=10)
        assert took < 10
        # Every idle socket was accepted: none waits in the listen queue.
        assert open_fds(proc.pid) >= IDLE_SOCKETS


# Descriptors gRPC's own threads may open beside the connections.
GRPC_FD_SLACK = 8


def test_connections_beyond_the_cap_are_closed_and_idle_handshakes_dropped() -> None:
    cap = 64
    with (
        serve(
            "--max-connections",
            str(cap),
            "--handshake-timeout-s",
            "1",
            soft_limit=START_SOFT_LIMIT,
        ) as (proc, address),
    ):
        # The baseline after one call, once gRPC has opened what it keeps
        # open (its pollers and wakeup pipes come lazily); a few more may come
        # and go with its threads.
        planner_info(address, timeout_s=30, wait_for_ready=True)
        baseline = open_fds(proc.pid) + GRPC_FD_SLACK
        with idle_sockets(address, 4 * cap) as sockets:
            # The server holds at most the cap, and closes what it accepted
            # but has no handshake for within the timeout.
            assert open_fds(proc.pid) <= baseline + cap
            assert closed_by_peer(sockets[0], timeout_s=15)
            took = planner_info(address, timeout_s=30, wait_for_ready=True)
            assert took < 30
            assert open_fds(proc.pid) <= baseline + cap


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--max-connections", "0"),
        ("--handshake-timeout-s", "nan"),
        ("--connection-idle-s", "-1"),
        ("--handshake-timeout-s", "1e12"),
    ],
)
def test_bad_connection_settings_are_refused(flag: str, value: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "planner.cli", "serve", "--store", ":memory:", flag, value],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert flag in done.stderr
    assert "Traceback" not in done.stderr


def test_a_descriptor_limit_without_room_for_connections_is_refused() -> None:
    done = subprocess.run(
        with_open_file_limit(
            RESERVED_FDS,
            RESERVED_FDS,
            *(sys.executable, "-m", "planner.cli", "serve", "--port", "0", "--store", ":memory:"),
        ),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "open-file limit (128)" in done.stderr
    assert "Traceback" not in done.stderr
