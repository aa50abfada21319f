"""`planner replay TRACE`: run policies side by side on a recorded or
generated trace and compare them. The same policy functions the service runs
are called in process; see planner.replay."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from planner.domain.requests import Slo
from planner.domain.rotation import RotationParams
from planner.profiles.errors import ProfileError
from planner.replay.engine import Engine
from planner.replay.metrics import PolicyMetrics, compare
from planner.replay.noise import JitteredCost
from planner.replay.plots import write_report
from planner.replay.progress import replay_progress
from planner.replay.records import ReplayResult
from planner.replay.report import print_report, write_json
from planner.replay.schedulers import POLICY_NAMES, make_scheduler
from planner.replay.setup import DEFAULT_PROFILE, ReplayKnobs, ReplaySetup, build_setup, scale_rate
from planner.trace.errors import TraceError
from planner.trace.io import load_trace
from planner.trace.records import TraceRequest

EXIT_BAD_INPUT = 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "replay",
        help="compare policies on a trace in a simulated engine",
        description="Replay a JSON-lines trace (see `planner trace`) through a simulated "
        "engine once per policy, each on the identical arrivals, and compare TTFT/TBT/TPOT "
        f"attainment, latency, throughput and transfers. Policies: {', '.join(POLICY_NAMES)}.",
    )
    p.add_argument("trace", help="JSON-lines trace file")
    p.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        help="MODEL@HARDWARE (built-in names: planner profiles list) or MODEL@FILE.json "
        f"(a measured profile); default {DEFAULT_PROFILE}",
    )
    p.add_argument(
        "--policy",
        action="append",
        choices=POLICY_NAMES,
        help="a policy to run (repeat; default: fcfs and lvf)",
    )
    p.add_argument("--slo-ttft", type=float, default=5.0, help="TTFT SLO, s (default 5)")
    p.add_argument("--slo-tbt", type=float, default=0.1, help="TBT SLO, s (default 0.1)")
    p.add_argument(
        "--rate-scale",
        type=float,
        action="append",
        help="replay arrivals this many times faster (repeat to sweep load; default 1)",
    )
    p.add_argument("--alpha", type=float, default=3.0, help="LVF: rotary weight (default 3)")
    p.add_argument("--beta-tbt", type=float, default=0.0, help="LVF (default 0)")
    p.add_argument("--beta-ttft", type=float, default=0.5, help="LVF (default 0.5)")
    p.add_argument(
        "--transfer-budget-blocks",
        type=int,
        help="LVF: B_xfer per iteration (default: link bandwidth x previous iteration time)",
    )
    p.add_argument(
        "--max-batched-tokens",
        type=int,
        default=2048,
        help="chunked-prefill token budget per iteration (default 2048)",
    )
    p.add_argument("--max-running", type=int, default=256, help="running requests at most")
    p.add_argument(
        "--cpu-kv-gb", type=float, help="CPU memory for swapped KV, GB (default 90%% of host)"
    )
    p.add_argument(
        "--compute-jitter",
        type=float,
        default=0.0,
        metavar="CV",
        help="multiply each iteration's modelled time by seeded lognormal noise with mean 1 "
        "and this coefficient of variation (default 0: the model exactly)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of every random draw of a run (--compute-jitter); the same seed gives the "
        "same numbers (default 0)",
    )
    p.add_argument("--json-out", type=Path, help="write every number as JSON here")
    p.add_argument("--report-dir", type=Path, help="write PNG plots here")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _fail(message: str) -> int:
    print(f"planner replay: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def run(args: argparse.Namespace) -> int:
    # NaN passes a "<= 0" test and an infinite rate scale puts every arrival
    # at 0 (NaN would hang the engine): numbers must be finite.
    for name in ("slo_ttft", "slo_tbt", "max_batched_tokens", "max_running"):
        value = getattr(args, name)
        if not math.isfinite(value) or value <= 0:
            return _fail(f"--{name.replace('_', '-')} must be a finite number > 0, got {value}")
    scales = args.rate_scale or [1.0]
    for scale in scales:
        if not math.isfinite(scale) or scale <= 0:
            return _fail(f"--rate-scale must be a finite number > 0, got {scale}")
    if args.cpu_kv_gb is not None and not (math.isfinite(args.cpu_kv_gb) and args.cpu_kv_gb >= 0):
        return _fail(f"--cpu-kv-gb must be a finite number >= 0, got {args.cpu_kv_gb}")
    if not (math.isfinite(args.alpha) and args.alpha >= 0):
        return _fail(f"--alpha must be a finite number >= 0, got {args.alpha}")
    for name in ("beta_tbt", "beta_ttft"):
        if not math.isfinite(getattr(args, name)):
            return _fail(f"--{name.replace('_', '-')} must be a finite number")
    if not (math.isfinite(args.compute_jitter) and args.compute_jitter >= 0):
        return _fail(f"--compute-jitter must be a finite number >= 0, got {args.compute_jitter}")
    if args.transfer_budget_blocks is not None and args.transfer_budget_blocks < 0:
        return _fail("--transfer-budget-blocks must be >= 0")
    policies = list(dict.fromkeys(args.policy or ["fcfs", "lvf"]))
    try:
        trace = load_trace(args.trace)
    except TraceError as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"cannot read {args.trace}: {exc.strerror or exc}")
    slo = Slo(ttft_s=args.slo_ttft, tbt_s=args.slo_tbt)
    knobs = ReplayKnobs(
        slo=slo,
        rotation=RotationParams(
            alpha=args.alpha,
            beta_tbt=args.beta_tbt,
            beta_ttft=args.beta_ttft,
            transfer_budget_blocks=args.transfer_budget_blocks,
        ),
        max_batched_tokens=args.max_batched_tokens,
        max_running=args.max_running,
        cpu_kv_bytes=int(args.cpu_kv_gb * 1e9) if args.cpu_kv_gb is not None else None,
    )
    try:
        setup = build_setup(args.profile, knobs)
    except (ProfileError, OSError) as exc:
        return _fail(str(exc))

    sweep: dict[float, list[PolicyMetrics]] = {}
    main_results: list[ReplayResult] = []
    for scale in scales:
        scaled = scale_rate(trace, scale)
        results = [
            _run_one(
                scaled,
                policy,
                setup,
                scale,
                quiet=args.quiet,
                jitter_cv=args.compute_jitter,
                seed=args.seed,
            )
            for policy in policies
        ]
        sweep[scale] = compare(results)
        if not main_results:
            main_results = results
    metrics = sweep[scales[0]]
    print_report(
        metrics,
        title=f"Replay of {args.trace} ({len(trace):,} requests, rate x{scales[0]:g}, "
        f"{setup.model.name} on {setup.hardware.name})",
        caption=f"SLO TTFT {slo.ttft_s:g} s, TBT {slo.tbt_s * 1e3:g} ms; GPU KV "
        f"{setup.engine.gpu_kv_blocks:,} blocks, CPU KV {setup.engine.cpu_kv_blocks:,} blocks",
        sweep=sweep if len(scales) > 1 else None,
    )
    if args.json_out is not None:
        write_json(args.json_out, main_results, metrics, sweep=sweep if len(scales) > 1 else None)
        print(f"wrote {args.json_out}")
    if args.report_dir is not None:
        paths = write_report(
            args.report_dir, main_results, metrics, sweep=sweep if len(scales) > 1 else None
        )
        print(f"wrote {len(paths)} plots to {args.report_dir}")
    return 0


def _run_one(
    trace: list[TraceRequest],
    policy: str,
    setup: ReplaySetup,
    scale: float,
    *,
    quiet: bool,
    jitter_cv: float,
    seed: int,
) -> ReplayResult:
    # Every policy gets a generator seeded alike: the same noise sequence.
    cost = JitteredCost(setup.cost, jitter_cv, seed) if jitter_cv > 0 else setup.cost
    engine = Engine(
        setup.engine,
        make_scheduler(policy, setup.rotation),
        cost,
        setup.link,
        trace,
    )
    last_arrival = trace[-1].arrival_s if trace else 0.0
    with replay_progress(
        f"{policy} x{scale:g}", last_arrival, requests=len(trace), quiet=quiet
    ) as bar:
        result = engine.run(progress=bar.update)
    config = {
        **setup.describe(),
        "policy": policy,
        "rate_scale": scale,
        "compute_jitter_cv": jitter_cv,
        "seed": seed,
    }
    return ReplayResult(
        policy=result.policy,
        requests=result.requests,
        timeline=result.timeline,
        totals=result.totals,
        config=config,
    )
