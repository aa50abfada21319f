"""One engine of `planner bench service`: a client process calling one RPC at
an iteration rate over its own gRPC channel.

Run as `python -m planner.bench.service_client`, never forked: the channel is
created in this fresh process. Protocol with the parent: connect and make
one untimed call, print "ready", wait for a line on stdin (the start
signal every client gets at once), call for --duration-s, write the outcome
as JSON to --out, exit. Imports only grpc, so 64 of these start quickly.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import grpc

READY = "ready"
CONNECT_TIMEOUT_S = 60.0
NS_PER_S = 1_000_000_000


def _identity(data: bytes) -> bytes:
    return data


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="planner.bench.service_client")
    p.add_argument("--target", required=True, help="HOST:PORT of the server")
    p.add_argument("--method", required=True, help="/package.Service/Method")
    p.add_argument("--request-file", type=Path, required=True, help="serialized request")
    p.add_argument("--rate-hz", type=float, required=True, help="calls per second; 0: unpaced")
    p.add_argument("--duration-s", type=float, required=True)
    p.add_argument("--deadline-ms", type=float, required=True)
    p.add_argument("--out", type=Path, required=True, help="JSON outcome written here")
    return p.parse_args(argv)


def call_loop(
    call: Any, request: bytes, rate_hz: float, duration_s: float, deadline_s: float
) -> dict[str, Any]:
    """Calls like an engine iterating at rate_hz: one call per iteration,
    the next iteration starting a period after the previous one began, or at
    once when the call took longer (then `late_starts` counts it). Returns
    latencies in ns per status code name."""
    period_ns = int(NS_PER_S / rate_hz) if rate_hz > 0 else 0
    latencies: dict[str, list[int]] = {}
    late_starts = 0
    start = time.perf_counter_ns()
    stop = start + int(duration_s * NS_PER_S)
    next_start = start
    while True:
        now = time.perf_counter_ns()
        if next_start > now:
            time.sleep((next_start - now) / NS_PER_S)
        elif period_ns and now - next_start > period_ns:
            late_starts += 1
            next_start = now
        began = time.perf_counter_ns()
        if began >= stop:
            break
        try:
            call(request, timeout=deadline_s)
            code = "OK"
        except grpc.RpcError as exc:
            code = exc.code().name
        latencies.setdefault(code, []).append(time.perf_counter_ns() - began)
        next_start += period_ns
    return {
        "latencies_ns": latencies,
        "late_starts": late_starts,
        "elapsed_ns": time.perf_counter_ns() - start,
    }


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    request = args.request_file.read_bytes()
    deadline_s = args.deadline_ms / 1000.0
    with grpc.insecure_channel(
        args.target, options=[("grpc.enable_retries", 0), ("grpc.max_send_message_length", -1)]
    ) as channel:
        grpc.channel_ready_future(channel).result(timeout=CONNECT_TIMEOUT_S)
        call = channel.unary_unary(
            args.method, request_serializer=_identity, response_deserializer=_identity
        )
        # Warm-up only; a busy server may refuse it.
        with contextlib.suppress(grpc.RpcError):
            call(request, timeout=CONNECT_TIMEOUT_S)
        print(READY, flush=True)
        if not sys.stdin.readline():
            return 1
        outcome = call_loop(call, request, args.rate_hz, args.duration_s, deadline_s)
    args.out.write_text(json.dumps(outcome), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
