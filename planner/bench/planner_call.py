"""The planner call as an engine adapter makes it, alone: PlannerLink over
loopback gRPC to a real `planner serve` (or in process), one call per
simulated step, with or without a busy Python thread beside the caller (what
vLLM's output and input threads are to its scheduler), with the adapter's
short GIL switch interval during the call or with CPython's default.
Synchronous (the default here), each step waits for its call; --pipelined,
the call is sent as a step's forward pass starts and taken when it ends
(PlanPipeline, the vLLM adapter's default): what counts is how often the
answer is not there (late) and what the step waited.

    python -m planner.bench.planner_call [--requests 100] [--calls 600] [--busy-thread]
        [--pipelined] [--step-ms 5]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import threading
import time

from planner.adapters.common.channel import CALL_SWITCH_INTERVAL_S
from planner.adapters.common.counters import FallbackCounters, FallbackReason
from planner.adapters.common.link import PlannerLink, PlanPipeline
from planner.adapters.common.snapshot import (
    EngineRequestView,
    PoolSizes,
    ViewState,
    build_rotation_request,
)
from planner.bench.server_process import ServerProcess
from planner.v1 import rotation_pb2

NOW_S = 1000.0


def snapshot(num_requests: int, seed: int = 0) -> rotation_pb2.PlanRotationRequest:
    """A quarter running, the rest waiting: a vLLM step under KV pressure."""
    return build_rotation_request(*snapshot_views(num_requests, seed))


def snapshot_views(
    num_requests: int, seed: int = 0
) -> tuple[list[EngineRequestView], PoolSizes, float]:
    """What snapshot() is built from: the views, the pools and the time."""
    rng = random.Random(seed)
    views = []
    for i in range(num_requests):
        running = i < num_requests // 4
        views.append(
            EngineRequestView(
                f"req-{i}",
                ViewState.RUNNING if running else ViewState.WAITING,
                prompt_tokens=170,
                computed_tokens=170 if running else 0,
                output_tokens=20 if running else 0,
                gpu_blocks=7 if running else 0,
                cpu_blocks=0,
                arrival_s=NOW_S - rng.uniform(0, 5),
                run_start_s=NOW_S - 1 if running else None,
                last_token_s=NOW_S - 0.05 if running else None,
            )
        )
    return views, PoolSizes(3, 32, 4096), NOW_S


def measure(
    link: PlannerLink, request: rotation_pb2.PlanRotationRequest, calls: int, step_s: float = 0.005
) -> list[float]:
    link.wait_idle()
    for _ in range(20):
        link.plan_rotation(request)
    latencies = []
    for _ in range(calls):
        start = time.perf_counter()
        link.plan_rotation(request)
        latencies.append(time.perf_counter() - start)
        time.sleep(step_s)  # a step's forward pass
    return sorted(latencies)


def measure_pipelined(
    link: PlannerLink, request: rotation_pb2.PlanRotationRequest, steps: int, step_s: float
) -> tuple[list[float], int, int]:
    """Per step: take the answer sent a step ago, send the next, run the
    "forward pass" (sleep step_s). Returns each step's wait (sorted), the
    steps without an answer in time, and the steps that asked."""
    pipeline: PlanPipeline[None] = PlanPipeline(link)
    # In process, calls fall back until the planner thread has loaded.
    link.wait_idle()
    for _ in range(20):
        pipeline.send(request, None)
        pipeline.take()
    before = link.counters.snapshot()
    link.counters.drain_latencies()
    waits = []
    for _ in range(steps):
        start = time.perf_counter()
        pipeline.take()
        waits.append(time.perf_counter() - start)
        pipeline.send(request, None)
        time.sleep(step_s)
    after = link.counters.snapshot()
    late = after.fallbacks[FallbackReason.DEADLINE] - before.fallbacks[FallbackReason.DEADLINE]
    return sorted(waits), late, steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--deadline-ms", type=float, default=5.0)
    parser.add_argument("--in-process", action="store_true")
    parser.add_argument("--busy-thread", action="store_true")
    parser.add_argument("--pipelined", action="store_true", help="PlanPipeline, as vLLM's adapter")
    parser.add_argument("--step-ms", type=float, default=5.0, help="the forward pass")
    parser.add_argument(
        "--default-switch-interval",
        action="store_true",
        help="keep CPython's GIL switch interval during the call",
    )
    args = parser.parse_args(argv)
    switch_s = None if args.default_switch_interval else CALL_SWITCH_INTERVAL_S
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            for i in range(1000):
                x += i

    if args.busy_thread:
        threading.Thread(target=spin, daemon=True).start()
    request = snapshot(args.requests)
    deadline_s = args.deadline_ms / 1e3
    step_s = args.step_ms / 1e3
    late = steps = 0
    calls: list[float] = []
    try:
        with contextlib.ExitStack() as stack:
            target = None if args.in_process else stack.enter_context(ServerProcess()).address
            link = stack.enter_context(
                PlannerLink(
                    target,
                    deadline_s,
                    FallbackCounters(keep_latencies=True),
                    switch_interval_s=switch_s,
                )
            )
            if args.pipelined:
                lat, late, steps = measure_pipelined(link, request, args.calls, step_s)
                calls = sorted(link.counters.drain_latencies())
            else:
                lat = measure(link, request, args.calls, step_s)
    finally:
        stop.set()
    where = (
        f"{'in process' if args.in_process else 'gRPC loopback'}, {args.requests} requests, "
        f"busy thread {'yes' if args.busy_thread else 'no'}, switch interval during the call "
        f"{(switch_s or sys.getswitchinterval()) * 1e3:g} ms"
    )
    if args.pipelined:
        print(
            f"{where}, pipelined over {args.step_ms:g} ms steps: step wait "
            f"p50 {_pct(lat, 0.5) * 1e3:.3f} ms, p99 {_pct(lat, 0.99) * 1e3:.3f} ms; "
            f"call p50 {_pct(calls, 0.5) * 1e3:.2f} ms, p99 {_pct(calls, 0.99) * 1e3:.2f} ms; "
            f"late {100 * late / steps:.1f} % of {steps} steps"
        )
        return 0
    over = sum(x > deadline_s for x in lat) / len(lat)
    print(
        f"{where}: p50 {_pct(lat, 0.5) * 1e3:.2f} ms, p99 {_pct(lat, 0.99) * 1e3:.2f} ms, "
        f"over {args.deadline_ms:g} ms {100 * over:.1f} % of {len(lat)}"
    )
    return 0


def _pct(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


if __name__ == "__main__":
    raise SystemExit(main())
