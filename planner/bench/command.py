"""`planner bench`: measured speed, written next to its targets.

`planner bench policies --policy rotation` times the rotation decision in
process and through a real server over gRPC, prints a table, and optionally
writes JSON (--out), its docs/benchmarks.md section (--markdown) and a
comparison with an earlier JSON (--baseline; exit status 1 on a regression).
`planner bench policies --policy buddy` times KunServe's buddy-group
planning and measures the greedy's gap to the exact optimum
(planner.bench.buddy; --calls, --seed, --out and --markdown apply).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

from planner.bench import (
    buddy,
    calibration,
    kernels,
    ledger,
    replay_speed,
    rotation,
    rotation_quality,
    service,
    solvers_offload,
    trace_io,
)
from planner.bench.baseline import compare
from planner.bench.machine import load_average, machine_info
from planner.bench.markdown import write_section
from planner.bench.result_options import (
    add_baseline_options,
    add_output_options,
    result_command_args,
)
from planner.bench.results import Report
from planner.bench.rotation_report import SECTION, markdown_section, text_report
from planner.bench.server_process import ServerStartError
from planner.bench.targets import evaluate, reference

EXIT_OK = 0
EXIT_REGRESSED = 1
EXIT_BAD_INPUT = 2
DEFAULTS = rotation.RotationBenchConfig()


def _sizes(text: str) -> tuple[int, ...]:
    """Comma-separated request counts; empty for none."""
    try:
        sizes = tuple(int(s.replace("_", "")) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text!r}"
        ) from None
    if any(n < 1 for n in sizes):
        raise argparse.ArgumentTypeError(f"sizes must be >= 1: {text!r}")
    return sizes


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _join(sizes: tuple[int, ...]) -> str:
    return ",".join(str(n) for n in sizes)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "bench",
        help="measure decision latency and simulator speed",
        description="Benchmarks: measured speed next to its targets (docs/benchmarks.md).",
    )
    benches = p.add_subparsers(dest="bench", metavar="BENCH")
    p.set_defaults(func=lambda args: _usage(p))
    q = benches.add_parser(
        "policies",
        help="decision latency of a policy, in process and over gRPC",
        description="Decision latency of a policy on seeded synthetic snapshots: the policy "
        "function, the in-process RPC path (proto conversion included) and a real "
        "`planner serve` over gRPC on loopback. Median, p99, mean and max per case. "
        "Exit status 1 when --baseline finds a regression.",
    )
    q.add_argument(
        "--policy",
        choices=["rotation", "buddy"],
        default="rotation",
        help="(default rotation; buddy: KunServe group planning time for 8, 64 and 1,024 "
        "instances and the greedy's gap to the exact optimum, in process only)",
    )
    q.add_argument(
        "--sizes",
        type=_sizes,
        default=DEFAULTS.sizes,
        help=f"tracked requests per snapshot, counts level (default {_join(DEFAULTS.sizes)})",
    )
    q.add_argument(
        "--block-level-sizes",
        type=_sizes,
        default=DEFAULTS.block_level_sizes,
        help="sizes also measured block level, every block id given; '' for none "
        f"(default {_join(DEFAULTS.block_level_sizes)})",
    )
    q.add_argument(
        "--calls",
        type=_positive_int,
        help="timed calls per case (default 2000 up to 100 requests, 1000 up to 1,000, 200 "
        f"above; a case that would take over {DEFAULTS.case_budget_s:g} s gets fewer, at least "
        "200)",
    )
    q.add_argument(
        "--warmup", type=_non_negative_int, help="untimed calls first (default calls / 10)"
    )
    q.add_argument("--seed", type=int, default=DEFAULTS.seed, help="synthetic snapshots' seed")
    q.add_argument("--no-grpc", action="store_true", help="skip the gRPC cases (no server)")
    add_output_options(q)
    add_baseline_options(q)
    q.set_defaults(func=run_policies)
    replay_speed.register(benches)
    rotation_quality.register(benches)
    solvers_offload.register(benches)
    kernels.register(benches)
    service.register(benches)
    ledger.register(benches)
    calibration.register(benches)
    trace_io.register(benches)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_BAD_INPUT


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this run (options left at their defaults
    are omitted)."""
    parts = ["planner", "bench", "policies", "--policy", args.policy]
    if args.sizes != DEFAULTS.sizes:
        parts += ["--sizes", _join(args.sizes)]
    if args.block_level_sizes != DEFAULTS.block_level_sizes:
        parts += ["--block-level-sizes", _join(args.block_level_sizes) or "''"]
    for flag, value in (("--calls", args.calls), ("--warmup", args.warmup)):
        if value is not None:
            parts += [flag, str(value)]
    if args.seed != DEFAULTS.seed:
        parts += ["--seed", str(args.seed)]
    if args.no_grpc:
        parts.append("--no-grpc")
    parts += result_command_args(args)
    return " ".join(parts)


def _load_json(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def _progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def run_buddy(args: argparse.Namespace) -> int:
    """--policy buddy: its own cases (planner.bench.buddy); the rotation
    options that do not apply are refused."""
    if args.baseline is not None:
        print("planner bench: --baseline is not available with --policy buddy", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.sizes != DEFAULTS.sizes or args.block_level_sizes != DEFAULTS.block_level_sizes:
        print(
            "planner bench: --sizes and --block-level-sizes apply to --policy rotation",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    config = buddy.BuddyBenchConfig(seed=args.seed)
    if args.calls is not None:
        config = buddy.BuddyBenchConfig(
            calls=args.calls, warmup=args.warmup or max(args.calls // 10, 3), seed=args.seed
        )
    parts = ["planner", "bench", "policies", "--policy", "buddy"]
    if args.calls is not None:
        parts += ["--calls", str(args.calls)]
    if args.seed != DEFAULTS.seed:
        parts += ["--seed", str(args.seed)]
    for flag, path in (("--out", args.out), ("--markdown", args.markdown)):
        if path is not None:
            parts += [flag, str(path)]
    report = buddy.run(config, " ".join(parts))
    print(buddy.text_report(report))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if args.markdown is not None:
        write_section(args.markdown, buddy.SECTION, buddy.markdown_section(report))
    return EXIT_OK


def run_policies(args: argparse.Namespace) -> int:
    if args.policy == "buddy":
        return run_buddy(args)
    baseline_json = None
    if args.baseline is not None:
        try:
            baseline_json = _load_json(args.baseline)
        except (OSError, ValueError) as exc:
            print(f"planner bench: cannot read baseline {args.baseline}: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
    if args.regression_factor <= 1.0:
        print("planner bench: --regression-factor must be > 1", file=sys.stderr)
        return EXIT_BAD_INPUT
    config = rotation.RotationBenchConfig(
        sizes=args.sizes,
        block_level_sizes=args.block_level_sizes,
        seed=args.seed,
        calls=args.calls,
        warmup=args.warmup,
        grpc=not args.no_grpc,
    )
    machine = machine_info()
    try:
        measured = rotation.run(config, progress=_progress)
    except ServerStartError as exc:
        print(f"planner bench: {exc}", file=sys.stderr)
        return 1
    machine["load_avg_1m_at_end"] = load_average()
    report = Report(
        bench=f"policies/{args.policy}",
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        command=command_line(args),
        machine=machine,
        config=config.to_json(),
        results=measured.results,
        targets=evaluate(measured.results),
        reference=reference(measured.results),
        grpc_floor=measured.grpc_floor,
    )
    if baseline_json is not None:
        try:
            report.baseline = compare(measured.results, baseline_json, args.regression_factor)
        except (KeyError, TypeError, ValueError) as exc:
            print(f"planner bench: baseline {args.baseline} unusable: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
    print(text_report(report))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")
    if args.markdown is not None:
        write_section(args.markdown, SECTION, markdown_section(report))
    if report.baseline is not None and report.baseline["regressions"]:
        return EXIT_REGRESSED
    return EXIT_OK
