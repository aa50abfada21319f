"""`planner bench service`: concurrent engines against one `planner serve`.

N client processes, each with its own gRPC channel, call PlanRotation at an
iteration rate for a while (the load phase); --overload then drives servers
with the given limits past capacity with unpaced clients, to show
back-pressure (fast refusals, expiries at the deadline, a server that still
answers) rather than collapse. Exit status 1 when the load phase had a call
that was not OK, a server did not answer the call after a phase, or
--baseline finds a regression.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

from planner.bench.machine import load_average, machine_info
from planner.bench.markdown import write_section
from planner.bench.proto_request import FORMS
from planner.bench.reproduce_command import option_text
from planner.bench.result_options import (
    add_baseline_options,
    add_output_options,
    result_command_args,
)
from planner.bench.server_process import ServerStartError
from planner.bench.service_load import LoadError, PhaseConfig, ServerLimits, run_phase
from planner.bench.service_report import (
    LOAD_PHASE,
    SECTION,
    ServiceReport,
    compare,
    markdown_section,
    text_report,
)
from planner.service.limits import ServiceLimits

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
DEFAULT_OVERLOAD_LIMITS = (ServerLimits(8, 64), ServerLimits(8, 8), ServerLimits(1, 2))
DEFAULTS = {
    "clients": 64,
    "rate_hz": 5.0,
    "duration_s": 30.0,
    "deadline_ms": 500.0,
    "requests": 100,
    "form": "columns",
    "seed": 0,
    "max_workers": 8,
    # The server's default, twice the clients: gRPC frees a slot only after
    # the response went out, so an engine calling again at once can find its
    # last call still counted (tests/service/test_service_load.py).
    "max_concurrent_rpcs": ServiceLimits().max_concurrent_rpcs,
    "overload_duration_s": 8.0,
    "overload_limits": DEFAULT_OVERLOAD_LIMITS,
}


def _positive(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float:
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _limits_list(text: str) -> tuple[ServerLimits, ...]:
    """WORKERS:RPCS pairs, comma-separated."""
    limits = []
    for item in text.split(","):
        workers, sep, rpcs = item.strip().partition(":")
        try:
            pair = ServerLimits(int(workers), int(rpcs)) if sep else None
        except ValueError:
            pair = None
        if pair is None or pair.max_workers < 1 or pair.max_concurrent_rpcs < 1:
            raise argparse.ArgumentTypeError(
                f"expected WORKERS:RPCS pairs of positive integers, got {item!r}"
            )
        limits.append(pair)
    return tuple(limits)


def _join_limits(limits: tuple[ServerLimits, ...]) -> str:
    return ",".join(f"{x.max_workers}:{x.max_concurrent_rpcs}" for x in limits)


def _flag(name: str) -> str:
    """The option of a DEFAULTS name."""
    return "--" + name.replace("_", "-")


def _add_default_option(
    p: argparse.ArgumentParser,
    name: str,
    parse: Any,
    text: str,
    choices: tuple[str, ...] | None = None,
) -> None:
    """The option of name, parsed by parse, defaulting to DEFAULTS[name],
    whose help ends with that default."""
    default = DEFAULTS[name]
    p.add_argument(
        _flag(name),
        type=parse,
        choices=choices,
        default=default,
        help=f"{text} (default {option_text(default)})",
    )


def register(benches: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = DEFAULTS
    p = benches.add_parser(
        "service",
        help="concurrent engines over gRPC: throughput, p50/p99/p999, errors, server memory",
        description=" ".join((__doc__ or "").split("\n\n")[1].split()),
    )
    _add_default_option(p, "clients", _positive(int), "client processes")
    _add_default_option(
        p, "rate_hz", _non_negative_float, "calls per second per client; 0: unpaced"
    )
    _add_default_option(p, "duration_s", _positive(float), "length of the load phase")
    _add_default_option(p, "deadline_ms", _positive(float), "deadline of every call")
    _add_default_option(p, "requests", _positive(int), "tracked requests in the snapshot")
    _add_default_option(p, "form", None, "encoding of the requests", choices=FORMS)
    p.add_argument("--seed", type=int, default=d["seed"], help="synthetic snapshot's seed")
    _add_default_option(p, "max_workers", _positive(int), "the load phase server's --max-workers")
    _add_default_option(
        p,
        "max_concurrent_rpcs",
        _positive(int),
        "the load phase server's --max-concurrent-rpcs",
    )
    p.add_argument(
        "--overload",
        action="store_true",
        help="after the load phase, one unpaced phase per --overload-limits server",
    )
    _add_default_option(p, "overload_duration_s", _positive(float), "length of each overload phase")
    p.add_argument(
        "--overload-limits",
        type=_limits_list,
        default=d["overload_limits"],
        help="WORKERS:RPCS server limits, one overload phase each (default "
        f"{_join_limits(DEFAULT_OVERLOAD_LIMITS)})",
    )
    add_output_options(p)
    add_baseline_options(
        p, "a phase whose OK p50 grows, or throughput falls, by more than this factor"
    )
    p.set_defaults(func=run)


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this run (defaults omitted)."""
    parts = ["planner", "bench", "service"]
    for name, value in vars(args).items():
        if name in DEFAULTS and value != DEFAULTS[name]:
            text = _join_limits(value) if name == "overload_limits" else option_text(value)
            parts += [_flag(name), text]
    if args.overload:
        parts.append("--overload")
    parts += result_command_args(args)
    return " ".join(parts)


def phases(args: argparse.Namespace) -> list[PhaseConfig]:
    common = {
        "requests": args.requests,
        "form": args.form,
        "seed": args.seed,
        "clients": args.clients,
        "deadline_ms": args.deadline_ms,
    }
    load = PhaseConfig(
        LOAD_PHASE,
        rate_hz=args.rate_hz,
        duration_s=args.duration_s,
        limits=ServerLimits(args.max_workers, args.max_concurrent_rpcs),
        **common,
    )
    overload = (
        [
            PhaseConfig(
                f"overload {x.max_workers}w {x.max_concurrent_rpcs}c",
                rate_hz=0.0,
                duration_s=args.overload_duration_s,
                limits=x,
                **common,
            )
            for x in args.overload_limits
        ]
        if args.overload
        else []
    )
    return [load, *overload]


def _progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def _read_baseline(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    ServiceReport.from_json(data)
    return data


def run(args: argparse.Namespace) -> int:
    if args.regression_factor <= 1.0:
        print("planner bench service: --regression-factor must be > 1", file=sys.stderr)
        return EXIT_BAD_INPUT
    baseline_json = None
    if args.baseline is not None:
        try:
            baseline_json = _read_baseline(args.baseline)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(
                f"planner bench service: cannot use baseline {args.baseline}: {exc}",
                file=sys.stderr,
            )
            return EXIT_BAD_INPUT
    machine = machine_info()
    try:
        measured = [run_phase(config, _progress) for config in phases(args)]
    except (ServerStartError, LoadError) as exc:
        print(f"planner bench service: {exc}", file=sys.stderr)
        return EXIT_FAILED
    machine["load_avg_1m_at_end"] = load_average()
    report = ServiceReport(
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        command=command_line(args),
        machine=machine,
        phases=measured,
    )
    if baseline_json is not None:
        report.baseline = compare(measured, baseline_json, args.regression_factor)
    print(text_report(report))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")
    if args.markdown is not None:
        write_section(args.markdown, SECTION, markdown_section(report))
    return EXIT_FAILED if failed(report) else EXIT_OK


def failed(report: ServiceReport) -> bool:
    """The load phase had a call not OK, a server did not answer afterwards,
    or a phase regressed."""
    load_errors = any(p.errors for p in report.phases if p.config.name == LOAD_PHASE)
    probe_failed = any(p.probe_after != "OK" for p in report.phases)
    regressed = bool(report.baseline and report.baseline["regressions"])
    return load_errors or probe_failed or regressed
