"""Where one rotation call's time goes over loopback gRPC: the parts the
adapter and the server spend in Python, each timed alone on the same
snapshot (client snapshot build and serialization, server parse, conversion
in, policy, conversion out, response serialization and parse), and the
whole call through a real `planner serve` measured by the caller and by the
server (its grpc_server_handling_seconds histogram). What is left of the
caller's latency after the server's handling and the serialization is gRPC
transport and the wait for a thread to run (queueing).

--pin puts the caller on one core and the server on another
(sched_setaffinity, as `taskset -c` would), so what contention costs is
told from what the call costs; --busy-thread spins a Python thread beside
the caller (vLLM's engine core busy-waits on its worker); --busy-core N
spins a process on core N (another program's work on a core).

    python -m planner.bench.planner_call_parts [--requests 200] [--calls 400]
        [--pin] [--busy-thread] [--busy-core 1] [--step-ms 10] [--pipelined]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import statistics
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from planner.adapters.common.counters import FallbackCounters
from planner.adapters.common.link import PlannerLink, PlanPipeline
from planner.adapters.common.snapshot import build_rotation_request
from planner.bench import call_timing_report
from planner.bench.planner_call import snapshot, snapshot_views
from planner.bench.server_process import ServerProcess, add_planner_arg_option
from planner.bench.vllm_placement import set_thread_nice
from planner.policies.rotation import plan_rotation
from planner.service.convert.rotation import rotation_plan_to_proto, rotation_request_from_proto
from planner.service.limits import ServiceLimits
from planner.v1 import rotation_pb2

HANDLING = "grpc_server_handling_seconds"


def _median_ms(fn: Callable[[], object], repeat: int) -> float:
    for _ in range(min(20, repeat)):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def parts_ms(num_requests: int, repeat: int) -> dict[str, float]:
    """Each Python part of one call, alone, median ms."""
    views, pools, now_s = snapshot_views(num_requests)
    request = snapshot(num_requests)
    data = request.SerializeToString()
    limits = ServiceLimits()
    snap, inputs = rotation_request_from_proto(request, limits)
    plan = plan_rotation(snap, inputs)
    response = rotation_plan_to_proto(plan)
    answer = response.SerializeToString()
    return {
        "client: snapshot build": _median_ms(
            lambda: build_rotation_request(views, pools, now_s), repeat
        ),
        "client: serialize request": _median_ms(request.SerializeToString, repeat),
        "server: parse request": _median_ms(
            lambda: rotation_pb2.PlanRotationRequest.FromString(data), repeat
        ),
        "server: conversion in": _median_ms(
            lambda: rotation_request_from_proto(request, limits), repeat
        ),
        "server: policy": _median_ms(lambda: plan_rotation(snap, inputs), repeat),
        "server: conversion out": _median_ms(lambda: rotation_plan_to_proto(plan), repeat),
        "server: serialize response": _median_ms(response.SerializeToString, repeat),
        "client: parse response": _median_ms(
            lambda: rotation_pb2.PlanRotationResponse.FromString(answer), repeat
        ),
    }


def _handling(metrics_url: str) -> tuple[float, float]:
    """(count, sum s) of the server's PlanRotation handling histogram."""
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    count = total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != HANDLING:
            continue
        for sample in family.samples:
            if sample.labels.get("grpc_method") != "PlanRotation":
                continue
            if sample.name.endswith("_count"):
                count += sample.value
            elif sample.name.endswith("_sum"):
                total += sample.value
    return count, total


def _spin_thread(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        for i in range(1000):
            x += i


def _spin_process(core: int) -> None:
    os.sched_setaffinity(0, {core})
    x = 0
    while True:
        x += 1


@contextlib.contextmanager
def _busy(thread: bool, core: int | None) -> Iterator[None]:
    stop = threading.Event()
    proc = None
    if thread:
        threading.Thread(target=_spin_thread, args=(stop,), daemon=True).start()
    if core is not None:
        proc = multiprocessing.get_context("spawn").Process(
            target=_spin_process, args=(core,), daemon=True
        )
        proc.start()
    try:
        yield
    finally:
        stop.set()
        if proc is not None:
            proc.terminate()
            proc.join()


def calls(args: argparse.Namespace) -> dict[str, Any]:
    """Calls through a real server: the caller's latencies and the server's
    handling time over the same calls."""
    request = snapshot(args.requests)
    metrics_port = args.metrics_port
    cores = sorted(os.sched_getaffinity(0))
    with ServerProcess("--metrics-port", str(metrics_port), *args.planner_arg) as server:
        if args.server_nice is not None:
            set_thread_nice(server.pid, args.server_nice)
        if args.pin:
            if len(cores) < 2:
                raise SystemExit("--pin needs two cores")
            os.sched_setaffinity(server.pid, {cores[1]})
            os.sched_setaffinity(0, {cores[0]})
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        counters = FallbackCounters(keep_latencies=True)
        with PlannerLink(
            server.address,
            args.deadline_ms / 1e3,
            counters,
            pipelined_send="grpc-future" if args.grpc_future else "sender-thread",
            call_timing_log=None if args.call_timing_log is None else str(args.call_timing_log),
        ) as link:
            for _ in range(50):
                link.plan_rotation(request)
            counters.drain_latencies()
            if args.call_timing_log is not None:
                # The warm-up calls are not measured.
                args.call_timing_log.write_text("", encoding="utf-8")
            before = _handling(url)
            step_s = args.step_ms / 1e3
            # What sending a pipelined call holds the caller's thread.
            sends: list[float] = []
            with _busy(args.busy_thread, args.busy_core):
                if args.pipelined:
                    pipeline: PlanPipeline[None] = PlanPipeline(link)
                    for _ in range(args.calls):
                        pipeline.take()
                        start = time.perf_counter()
                        pipeline.send(request, None)
                        sends.append(time.perf_counter() - start)
                        time.sleep(step_s)
                    pipeline.take()
                else:
                    for _ in range(args.calls):
                        link.plan_rotation(request)
                        time.sleep(step_s)
            after = _handling(url)
            latencies = sorted(counters.drain_latencies())
    if args.pin:
        os.sched_setaffinity(0, set(cores))
    n = after[0] - before[0]
    handling_ms = (after[1] - before[1]) / n * 1e3 if n else float("nan")
    over = sum(x > args.deadline_ms / 1e3 for x in latencies)
    return {
        "calls": len(latencies),
        "call_mean_ms": statistics.fmean(latencies) * 1e3,
        "call_p50_ms": latencies[len(latencies) // 2] * 1e3,
        "call_p99_ms": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1e3,
        "over_deadline": over,
        "over_deadline_pct": 100 * over / len(latencies),
        "server_handling_mean_ms": handling_ms,
        "send_p50_ms": statistics.median(sends) * 1e3 if sends else math.nan,
        "send_p99_ms": sorted(sends)[int(0.99 * len(sends))] * 1e3 if sends else math.nan,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=300, help="timings of each part alone")
    parser.add_argument("--deadline-ms", type=float, default=5.0)
    parser.add_argument("--step-ms", type=float, default=10.0, help="the forward pass")
    parser.add_argument("--pipelined", action="store_true")
    parser.add_argument(
        "--grpc-future",
        action="store_true",
        help="pipelined calls start as gRPC's own future on the caller's thread, not through a "
        "sending thread",
    )
    parser.add_argument("--pin", action="store_true", help="caller and server on two cores")
    parser.add_argument("--busy-thread", action="store_true")
    parser.add_argument("--busy-core", type=int, help="a spinning process on this core")
    parser.add_argument(
        "--call-timing-log",
        type=Path,
        help="each call's moments, the caller's and the server's, one JSON line a call "
        "(planner.bench.call_timing_report reads it)",
    )
    parser.add_argument(
        "--server-nice", type=int, help="the nice value of every thread of the planner server"
    )
    add_planner_arg_option(parser)
    parser.add_argument("--metrics-port", type=int, default=9464)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    parts = parts_ms(args.requests, args.repeat)
    result = calls(args)
    python_ms = sum(parts.values()) - parts["client: snapshot build"]
    rest_ms = result["call_mean_ms"] - result["server_handling_mean_ms"]
    rest_ms -= parts["client: serialize request"] + parts["server: parse request"]
    rest_ms -= parts["server: serialize response"] + parts["client: parse response"]
    result["python_parts_ms"] = parts
    result["python_in_call_ms"] = python_ms
    result["transport_and_queueing_mean_ms"] = rest_ms
    result["load_average"] = os.getloadavg()[0]
    if args.call_timing_log is not None:
        timed = call_timing_report.report(
            call_timing_report.read_timings([args.call_timing_log]), args.deadline_ms
        )
        result["call_timing"] = timed.to_json()
        if not args.json:
            print(call_timing_report.markdown(timed))
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"{args.requests} requests, {result['calls']} calls "
        f"({'pipelined' if args.pipelined else 'synchronous'}, {args.step_ms:g} ms steps), "
        f"pin {'yes' if args.pin else 'no'}, busy thread {'yes' if args.busy_thread else 'no'}, "
        f"busy core {args.busy_core}, load average {result['load_average']:.2f}"
    )
    for name, ms in parts.items():
        print(f"  {name:30s} {ms:7.3f} ms")
    print(
        f"  call: mean {result['call_mean_ms']:.2f} ms, p50 {result['call_p50_ms']:.2f}, "
        f"p99 {result['call_p99_ms']:.2f}; over {args.deadline_ms:g} ms "
        f"{result['over_deadline']} ({result['over_deadline_pct']:.1f} %)"
    )
    print(
        f"  server handling (its histogram) mean {result['server_handling_mean_ms']:.3f} ms; "
        f"transport and queueing mean {rest_ms:.3f} ms"
    )
    if args.pipelined:
        print(
            f"  sending held the caller: p50 {result['send_p50_ms']:.3f} ms, "
            f"p99 {result['send_p99_ms']:.3f} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
