"""`planner replay TRACE`: run policies side by side on a recorded or
generated trace and compare them. The same policy functions the service runs
are called in process; see planner.replay."""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from planner.commands.config_file import (
    NO_ORIGINS,
    ConfigOrigins,
    add_config_argument,
    origins_of,
)
from planner.commands.knobs import add_knob_arguments
from planner.commands.trace import add_trace_argument, check_max_trace_bytes
from planner.domain.offload import OFFLOAD_BACKEND_NAMES, backend_named
from planner.domain.requests import Slo
from planner.domain.rotation import RotationParams
from planner.output_paths import (
    OutputPathError,
    check_output_file,
    check_output_folder,
)
from planner.profiles.errors import ProfileError
from planner.replay.cfs_paging import Paging, paging_target
from planner.replay.cfs_scheduler import CfsKnobs
from planner.replay.cluster_engine import ClusterEngine, ClusterRun
from planner.replay.cluster_report import (
    ClusterMetrics,
    cluster_json,
    print_cluster_report,
    summarize_cluster,
)
from planner.replay.cluster_setup import (
    ClusterKnobs,
    cluster_config,
)
from planner.replay.console import print_table
from planner.replay.engine import Engine, has_front_end, run_through_front_end
from planner.replay.longctx_engine import LongctxEngine, LongctxRun
from planner.replay.longctx_registry import make_longctx_policy
from planner.replay.longctx_report import (
    LongctxMetrics,
    longctx_json,
    print_longctx_report,
    summarize_longctx,
)
from planner.replay.longctx_setup import (
    REPLAY_OFFLOAD_PARAMS,
    LongctxKnobs,
    design_tokens,
    longctx_config,
)
from planner.replay.metrics import PolicyMetrics, compare
from planner.replay.noise import JitteredCost
from planner.replay.outputs import is_stdout, table_suffix_error, write_json_document, write_table
from planner.replay.plots import write_report
from planner.replay.policy_registries import (
    CLUSTER,
    LONG_CONTEXT,
    ROTATION,
    SERVERLESS,
    TOPOLOGY_POLICIES,
)
from planner.replay.progress import replay_progress
from planner.replay.records import ReplayResult
from planner.replay.report import print_report, to_json
from planner.replay.request_table import request_table
from planner.replay.scheduler_by_name import SCHEDULERS, make_scheduler
from planner.replay.serverless_engine import ServerlessEngine, ServerlessRun
from planner.replay.serverless_plots import write_serverless_report
from planner.replay.serverless_report import (
    ServerlessMetrics,
    compare_serverless,
    print_serverless_report,
    serverless_json,
    serverless_sweep_table,
)
from planner.replay.serverless_setup import (
    ServerlessKnobs,
    describe,
    serverless_config,
)
from planner.replay.setup import DEFAULT_PROFILE, ReplayKnobs, ReplaySetup, build_setup, scale_rate
from planner.trace.errors import SpecError, TraceError
from planner.trace.io import load_trace
from planner.trace.records import TraceRequest
from planner.trace.validate import MAX_ARRIVAL_S

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
# Replaying a year of arrivals in 30 s; more only piles every request onto
# the first instant.
MAX_RATE_SCALE = 1e6

DEFAULT_POLICIES: dict[str, tuple[str, ...]] = {
    ROTATION: ("fcfs", "lvf"),
    LONG_CONTEXT: TOPOLOGY_POLICIES[LONG_CONTEXT].names(),
    CLUSTER: TOPOLOGY_POLICIES[CLUSTER].names(),
    SERVERLESS: TOPOLOGY_POLICIES[SERVERLESS].names(),
}
DEFAULT_MAX_RUNNING = {ROTATION: 256, LONG_CONTEXT: 8, CLUSTER: 256, SERVERLESS: 64}
OFFLOAD_BACKENDS = OFFLOAD_BACKEND_NAMES

Progress = Callable[[float], None]
RunT = TypeVar("RunT")
MetricsT = TypeVar("MetricsT")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "replay",
        help="compare policies on a trace in a simulated engine",
        description="Replay a JSON-lines trace (see `planner trace`) through a simulated "
        "engine once per policy, each on the identical arrivals, and compare TTFT/TBT/TPOT "
        f"attainment, latency, throughput and transfers. Topologies: {ROTATION} (default; "
        f"one engine, scheduling and rotation policies), {LONG_CONTEXT} (one engine whose "
        f"decode steps fetch offloaded KV layers, OrbitFlow), {CLUSTER} (N instances behind a "
        f"least-loaded dispatcher, KunServe buddy groups and baselines) and {SERVERLESS} (one "
        "GH200 split into MIG slices sharing one C2C link, many models, C2CServe and "
        "baselines). Each topology's policies: --policy below, or `planner profiles policies`.",
    )
    add_trace_argument(p)
    p.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        help="MODEL@HARDWARE (built-in names: planner profiles list) or MODEL@FILE.json "
        f"(a measured profile); default {DEFAULT_PROFILE}",
    )
    p.add_argument(
        "--topology",
        choices=tuple(TOPOLOGY_POLICIES),
        default=ROTATION,
        help=f"what to simulate (default {ROTATION})",
    )
    p.add_argument(
        "--policy",
        action="append",
        metavar="NAME",
        help="a policy to run (repeat; " + _policy_choices_help() + ")",
    )
    p.add_argument(
        "--rate-scale",
        type=float,
        action="append",
        help="replay arrivals this many times faster (repeat to sweep load; default 1)",
    )
    add_knob_arguments(p)
    p.add_argument(
        "--json-out", type=Path, help="write every number as JSON here (- for standard output)"
    )
    p.add_argument(
        "--requests-out",
        type=Path,
        metavar="FILE.csv|FILE.parquet",
        help="write one row per request per run (every policy and rate scale): arrival, "
        "first token, finish, tokens, TTFT, TPOT, max TBT, SLOs met, preemptions, swaps "
        "(- for CSV on standard output)",
    )
    p.add_argument("--report-dir", type=Path, help="write PNG plots here")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_config_argument(p)
    p.set_defaults(func=run)


def _policy_choices_help() -> str:
    """Each topology's registered policies and its defaults, for --help."""
    parts = []
    for topology, registry in TOPOLOGY_POLICIES.items():
        default = DEFAULT_POLICIES[topology]
        runs = "all" if default == registry.names() else ", ".join(default)
        parts.append(f"--topology {topology}: {', '.join(registry)}; default {runs}")
    return "; ".join(parts)


# The options a --config file set, to name its line in an error.
_origins: ContextVar[ConfigOrigins] = ContextVar("replay_config_origins", default=NO_ORIGINS)


def _fail(message: str) -> int:
    print(f"planner replay: {_origins.get().locate(message)}", file=sys.stderr)
    return EXIT_BAD_INPUT


def run(args: argparse.Namespace) -> int:
    token = _origins.set(origins_of(args))
    try:
        return _run(args)
    finally:
        _origins.reset(token)


def _run(args: argparse.Namespace) -> int:
    # With a document on standard output, the report goes to standard error.
    args.stdout = sys.stdout
    on_stdout = [f for f in ("json_out", "requests_out") if is_stdout(getattr(args, f))]
    if len(on_stdout) > 1:
        return _fail("only one of --json-out and --requests-out can be - (standard output)")
    try:
        if on_stdout:
            with contextlib.redirect_stdout(sys.stderr):
                return _replay(args)
        return _replay(args)
    except OSError as exc:
        # Output paths are checked before the run; a disk that fills up
        # during it can still fail the last write.
        where = f" {exc.filename}" if exc.filename else ""
        print(f"planner replay: cannot write{where}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED


def _replay(args: argparse.Namespace) -> int:
    topology = args.topology
    if args.max_running is None:
        args.max_running = DEFAULT_MAX_RUNNING[topology]
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
        if scale > MAX_RATE_SCALE:
            return _fail(f"--rate-scale must be at most {MAX_RATE_SCALE:g}, got {scale:g}")
    try:
        for flag, path in (("--json-out", args.json_out), ("--requests-out", args.requests_out)):
            if not is_stdout(path):
                check_output_file(flag, path)
        check_output_folder("--report-dir", args.report_dir)
    except OutputPathError as exc:
        return _fail(str(exc))
    if args.requests_out is not None and (problem := table_suffix_error(args.requests_out)):
        return _fail(f"--requests-out {args.requests_out}: {problem}")
    if args.cpu_kv_gb is not None and not (math.isfinite(args.cpu_kv_gb) and args.cpu_kv_gb >= 0):
        return _fail(f"--cpu-kv-gb must be a finite number >= 0, got {args.cpu_kv_gb}")
    if args.block_size < 1:
        return _fail(f"--block-size must be >= 1, got {args.block_size}")
    for name in ("gpu_kv_blocks", "cpu_kv_blocks"):
        value = getattr(args, name)
        if value is None:
            continue
        flag = f"--{name.replace('_', '-')}"
        if topology != ROTATION:
            return _fail(f"{flag} applies to --topology {ROTATION} only")
        if value < (1 if name == "gpu_kv_blocks" else 0):
            bound = ">= 1" if name == "gpu_kv_blocks" else ">= 0"
            return _fail(f"{flag} must be {bound}, got {value}")
    if args.block_size != 16 and topology != ROTATION:
        return _fail(f"--block-size applies to --topology {ROTATION} only")
    if args.prefix_cache == "on" and topology != ROTATION:
        return _fail(f"--prefix-cache applies to --topology {ROTATION} only")
    if args.prefix_block_tokens < 1:
        return _fail(f"--prefix-block-tokens must be >= 1, got {args.prefix_block_tokens}")
    if not (math.isfinite(args.alpha) and args.alpha >= 0):
        return _fail(f"--alpha must be a finite number >= 0, got {args.alpha}")
    for name in ("beta_tbt", "beta_ttft", "lost_slack_tbts"):
        if not math.isfinite(getattr(args, name)):
            return _fail(f"--{name.replace('_', '-')} must be a finite number")
    for name in ("preempt_slack_tbts", "resume_slack_tbts"):
        if not math.isfinite(getattr(args, name)):
            return _fail(f"--{name.replace('_', '-')} must be a finite number")
    if not (math.isfinite(args.compute_jitter) and args.compute_jitter >= 0):
        return _fail(f"--compute-jitter must be a finite number >= 0, got {args.compute_jitter}")
    if args.transfer_budget_blocks is not None and args.transfer_budget_blocks < 0:
        return _fail("--transfer-budget-blocks must be >= 0")
    if not (math.isfinite(args.peer_kv_gb) and args.peer_kv_gb >= 0):
        return _fail(f"--peer-kv-gb must be a finite number >= 0, got {args.peer_kv_gb}")
    if args.cfs_every < 1:
        return _fail(f"--cfs-every must be >= 1, got {args.cfs_every}")
    if args.dram_copy_kib is not None and not (
        math.isfinite(args.dram_copy_kib) and args.dram_copy_kib * 1024 >= 1
    ):
        return _fail(f"--dram-copy-kib must be a finite number > 0, got {args.dram_copy_kib}")
    known = TOPOLOGY_POLICIES[topology]
    policies = list(dict.fromkeys(args.policy or DEFAULT_POLICIES[topology]))
    for policy in policies:
        if policy not in known:
            return _fail(
                f"unknown policy {policy!r} for --topology {topology} "
                f"(choose from {', '.join(known)})"
            )
    if args.offload_backend is not None and topology != LONG_CONTEXT:
        return _fail(f"--offload-backend applies to --topology {LONG_CONTEXT} only")
    if args.offload_node_limit is not None and topology != LONG_CONTEXT:
        return _fail(f"--offload-node-limit applies to --topology {LONG_CONTEXT} only")
    if args.offload_node_limit is not None and args.offload_node_limit < 1:
        return _fail("--offload-node-limit must be >= 1")
    if args.offload_stagger is not None and topology != LONG_CONTEXT:
        return _fail(f"--offload-stagger applies to --topology {LONG_CONTEXT} only")
    if args.offload_stagger is not None and args.offload_stagger < 0:
        return _fail("--offload-stagger must be >= 0")
    if args.offload_spread == "off" and topology != LONG_CONTEXT:
        return _fail(f"--offload-spread applies to --topology {LONG_CONTEXT} only")
    for name in ("gpu_kv_gb", "slo_scale", "offload_time_limit"):
        value = getattr(args, name)
        if value is None:
            continue
        flag = f"--{name.replace('_', '-')}"
        if topology != LONG_CONTEXT and not (topology == CLUSTER and name == "gpu_kv_gb"):
            return _fail(f"{flag} applies to --topology {LONG_CONTEXT} only")
        if not math.isfinite(value) or value <= 0:
            return _fail(f"{flag} must be a finite number > 0, got {value}")
    for name in ("instances", "link_gbps", "static_group_size", "restore_hold"):
        value = getattr(args, name)
        if value is None:
            continue
        flag = f"--{name.replace('_', '-')}"
        if topology != CLUSTER:
            return _fail(f"{flag} applies to --topology {CLUSTER} only")
        low_ok = value >= 0 if name == "restore_hold" else value > 0
        if not (math.isfinite(value) and low_ok):
            bound = ">= 0" if name == "restore_hold" else "> 0"
            return _fail(f"{flag} must be a finite number {bound}, got {value}")
    for name in (
        "mig",
        "c2c_gbps",
        "load_link",
        "switch_setup",
        "urgent_slack",
        "models_per_slice",
        "min_hold",
        "victim_slack",
        "starve_after",
        "max_drain",
        "share_max_in_flight",
        "disk_gbps",
        "host_memory_gb",
    ):
        value = getattr(args, name)
        if value is None:
            continue
        flag = f"--{name.replace('_', '-')}"
        if topology != SERVERLESS:
            return _fail(f"{flag} applies to --topology {SERVERLESS} only")
        if name in ("c2c_gbps", "disk_gbps", "host_memory_gb") and not (
            math.isfinite(value) and value > 0
        ):
            return _fail(f"{flag} must be a finite number > 0, got {value}")
        if name == "urgent_slack" and not math.isfinite(value):
            return _fail(f"{flag} must be a finite number, got {value}")
        if name == "models_per_slice" and value < 1:
            return _fail(f"{flag} must be >= 1, got {value}")
        if name in ("starve_after", "victim_slack"):
            if not value >= 0:
                return _fail(f"{flag} must be a number >= 0 (inf: never), got {value}")
        elif name not in (
            "mig",
            "c2c_gbps",
            "disk_gbps",
            "host_memory_gb",
            "load_link",
            "urgent_slack",
        ) and not (math.isfinite(value) and value >= 0):
            return _fail(f"{flag} must be a finite number >= 0, got {value}")
    try:
        # The serverless topology takes merged per-model traces: sorted here.
        check_max_trace_bytes(args.max_trace_bytes)
        trace = load_trace(args.trace, sort=topology == SERVERLESS, max_bytes=args.max_trace_bytes)
    except (TraceError, SpecError) as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"cannot read {args.trace}: {exc.strerror or exc}")
    for scale in scales:
        span_s = trace[-1].arrival_s / scale
        if span_s > MAX_ARRIVAL_S:
            return _fail(
                f"--rate-scale {scale:g} stretches the trace to {span_s:.3g} s, more than "
                f"a year ({MAX_ARRIVAL_S:.0f} s)"
            )
    slo = Slo(ttft_s=args.slo_ttft, tbt_s=args.slo_tbt)
    knobs = ReplayKnobs(
        slo=slo,
        rotation=RotationParams(
            alpha=args.alpha,
            beta_tbt=args.beta_tbt,
            beta_ttft=args.beta_ttft,
            transfer_budget_blocks=args.transfer_budget_blocks,
            preempt_slack_tbts=args.preempt_slack_tbts,
            resume_slack_tbts=args.resume_slack_tbts,
            lost_slack_tbts=args.lost_slack_tbts if args.lost_slack_tbts >= 0 else None,
        ),
        max_batched_tokens=args.max_batched_tokens,
        max_running=args.max_running,
        cpu_kv_bytes=int(args.cpu_kv_gb * 1e9) if args.cpu_kv_gb is not None else None,
        block_size_tokens=args.block_size,
        gpu_kv_blocks=args.gpu_kv_blocks,
        cpu_kv_blocks=args.cpu_kv_blocks,
        prefix_cache=args.prefix_cache == "on",
        prefix_block_tokens=args.prefix_block_tokens,
        admission_queue=args.admission_queue == "on",
    )
    try:
        setup = build_setup(args.profile, knobs)
    except (ProfileError, OSError) as exc:
        return _fail(str(exc))
    asked = _Invocation(args, trace, policies, scales)
    if topology == LONG_CONTEXT:
        return _run_long_context(asked, setup)
    if topology == CLUSTER:
        return _run_cluster(asked, setup)
    if topology == SERVERLESS:
        return _run_serverless(asked, setup)

    for policy in policies:
        if SCHEDULERS[policy].paging is Paging.PEER and not setup.hardware.nvlink_gbps > 0:
            return _fail(f"--policy {policy}: {setup.hardware.name} has no NVLink bandwidth")
    cfs = CfsKnobs(setup.engine.max_batched_tokens, args.cfs_every)
    peer_kv_bytes = int(args.peer_kv_gb * 1e9)
    dram_copy_bytes = int(args.dram_copy_kib * 1024) if args.dram_copy_kib is not None else None

    def replay(
        policy: str, scaled: list[TraceRequest], scale: float, progress: Progress
    ) -> ReplayResult:
        return _run_one(
            scaled,
            policy,
            setup,
            scale,
            progress,
            jitter_cv=args.compute_jitter,
            seed=args.seed,
            cfs=cfs,
            peer_kv_bytes=peer_kv_bytes,
            dram_copy_bytes=dram_copy_bytes,
        )

    runs = _sweep(
        asked, replay, summarize=compare, result_of=_same, summary_of=PolicyMetrics.to_json
    )
    sweep = runs.by_scale if len(scales) > 1 else None
    print_report(
        runs.metrics,
        title=f"Replay of {args.trace} ({len(trace):,} requests, rate x{scales[0]:g}, "
        f"{setup.model.name} on {setup.hardware.name})",
        caption=f"SLO TTFT {slo.ttft_s:g} s, TBT {slo.tbt_s * 1e3:g} ms; GPU KV "
        f"{setup.engine.gpu_kv_blocks:,} blocks, CPU KV {setup.engine.cpu_kv_blocks:,} blocks",
        sweep=sweep,
    )
    return _write_outputs(
        args,
        runs,
        document=lambda: to_json(runs.runs, runs.metrics, sweep=sweep),
        plots=lambda folder: write_report(folder, runs.runs, runs.metrics, sweep=sweep),
    )


@dataclass(frozen=True, slots=True)
class _Invocation:
    """What the command asks to replay: its options, the trace, the
    policies in order and the rate scales."""

    args: argparse.Namespace
    trace: list[TraceRequest]
    policies: list[str]
    scales: list[float]


@dataclass(frozen=True, slots=True)
class _Sweep(Generic[RunT, MetricsT]):
    """Every policy's run at every rate scale: the first scale's runs and
    metrics (what the report shows), each scale's metrics, and every run's
    result (the request table's rows)."""

    runs: list[RunT]
    metrics: list[MetricsT]
    by_scale: dict[float, list[MetricsT]]
    every_result: list[ReplayResult]


def _same(result: ReplayResult) -> ReplayResult:
    return result


def _sweep(
    asked: _Invocation,
    replay: Callable[[str, list[TraceRequest], float, Progress], RunT],
    *,
    summarize: Callable[[list[RunT]], list[MetricsT]],
    result_of: Callable[[RunT], ReplayResult],
    summary_of: Callable[[MetricsT], dict[str, Any]],
    report: Callable[[list[MetricsT], float], None] | None = None,
) -> _Sweep[RunT, MetricsT]:
    """Each rate scale in turn: every policy replayed on the scaled trace
    (replay(policy, scaled trace, scale, progress)) under a progress bar,
    the runs summarized, each handed with its summary to a caller in
    process (planner.api) and the scale's metrics to report."""
    args = asked.args
    first: tuple[list[RunT], list[MetricsT]] | None = None
    by_scale: dict[float, list[MetricsT]] = {}
    every_result: list[ReplayResult] = []
    for scale in asked.scales:
        scaled = scale_rate(asked.trace, scale)
        last_arrival = max((t.arrival_s for t in scaled), default=0.0)
        runs: list[RunT] = []
        for policy in asked.policies:
            with replay_progress(
                f"{policy} x{scale:g}", last_arrival, requests=len(scaled), quiet=args.quiet
            ) as bar:
                runs.append(replay(policy, scaled, scale, bar.update))
        metrics = summarize(runs)
        by_scale[scale] = metrics
        for run, m in zip(runs, metrics, strict=True):
            _collect(args, result_of(run), summary_of(m))
        every_result.extend(result_of(run) for run in runs)
        if report is not None:
            report(metrics, scale)
        if first is None:
            first = (runs, metrics)
    if first is None:
        raise ValueError("no rate scale to replay")
    return _Sweep(first[0], first[1], by_scale, every_result)


def _write_outputs(
    args: argparse.Namespace,
    runs: _Sweep[Any, Any],
    *,
    document: Callable[[], dict[str, Any]],
    plots: Callable[[Path], list[Path]],
) -> int:
    """--json-out (document()), --report-dir (plots(folder)) and
    --requests-out (every run's requests), those asked for."""
    if args.json_out is not None:
        write_json_document(args.json_out, document(), args.stdout)
        _wrote(args.json_out)
    if args.report_dir is not None:
        _wrote_plots(args.report_dir, plots(args.report_dir))
    if args.requests_out is not None:
        write_table(args.requests_out, request_table(runs.every_result), args.stdout)
        _wrote(args.requests_out)
    return 0


def _collect(args: argparse.Namespace, result: ReplayResult, summary: dict[str, Any]) -> None:
    """Hands each run to a caller in process (planner.api), if one asked."""
    collect: Callable[[ReplayResult, dict[str, Any]], None] | None = getattr(args, "collect", None)
    if collect is not None:
        collect(result, summary)


def _wrote(path: Path) -> None:
    if not is_stdout(path):
        print(f"wrote {path}")


def _wrote_plots(directory: Path, paths: list[Path]) -> None:
    names = ", ".join(p.name for p in paths)
    print(f"wrote {len(paths)} plots to {directory}: {names}")


def _run_one(
    trace: list[TraceRequest],
    policy: str,
    setup: ReplaySetup,
    scale: float,
    progress: Progress,
    *,
    jitter_cv: float,
    seed: int,
    cfs: CfsKnobs,
    peer_kv_bytes: int,
    dram_copy_bytes: int | None,
) -> ReplayResult:
    paging = SCHEDULERS[policy].paging
    engine_config, link = paging_target(
        paging,
        setup.engine,
        setup.link,
        setup.hardware,
        peer_kv_bytes=peer_kv_bytes,
        dram_copy_bytes=dram_copy_bytes,
    )

    def make_engine(admitted_s: Sequence[float] | None) -> Engine:
        # Every policy and every pass gets a generator seeded alike: the same
        # noise sequence.
        cost = JitteredCost(setup.cost, jitter_cv, seed) if jitter_cv > 0 else setup.cost
        return Engine(
            engine_config,
            make_scheduler(policy, setup.rotation, cfs),
            cost,
            link,
            trace,
            admitted_s=admitted_s,
        )

    result, passes, change_s = run_through_front_end(
        engine_config, trace, make_engine, progress=progress
    )
    config = {
        **setup.describe(),
        "policy": policy,
        **(
            {"cpu_kv_blocks": engine_config.cpu_kv_blocks, "paging_link": link.name}
            if paging is not Paging.ENGINE
            else {}
        ),
        **(
            {"front_end_passes": passes, "front_end_change_s": change_s}
            if has_front_end(engine_config)
            else {}
        ),
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


def _run_long_context(asked: _Invocation, setup: ReplaySetup) -> int:
    """The long-context offload topology (planner.replay.longctx_engine)."""
    args, trace = asked.args, asked.trace
    params = REPLAY_OFFLOAD_PARAMS
    if args.offload_time_limit is not None:
        params = replace(params, time_limit_s=args.offload_time_limit)
    if args.offload_node_limit is not None:
        params = replace(params, node_limit=args.offload_node_limit)
    if args.offload_backend is not None:
        params = replace(params, backend=backend_named(args.offload_backend))
    if args.offload_stagger is not None:
        params = replace(params, stagger_requests=args.offload_stagger)
    params = replace(params, spread_moves=args.offload_spread == "on")
    knobs = LongctxKnobs(
        max_running=args.max_running,
        gpu_kv_bytes=int(args.gpu_kv_gb * 1e9) if args.gpu_kv_gb is not None else None,
        slo_scale=args.slo_scale,
        jitter_cv=args.compute_jitter,
        seed=args.seed,
        params=params,
    )
    try:
        config, offload = longctx_config(setup, knobs)
    except ValueError as exc:
        return _fail(f"--gpu-kv-gb: {exc}")
    design = design_tokens(trace)

    def report(metrics: list[LongctxMetrics], scale: float) -> None:
        gpu_gb = config.gpu_block_budget * config.layer_block_bytes / 1e9
        print_longctx_report(
            metrics,
            title=f"Long-context replay of {args.trace} ({len(trace):,} requests, rate "
            f"x{scale:g}, {setup.model.name} on {setup.hardware.name})",
            caption=f"SLO TTFT {config.slo.ttft_s:g} s, TBT {config.slo.tbt_s * 1e3:.3g} ms; "
            f"GPU KV {gpu_gb:.3g} GB ({config.gpu_block_budget:,} layer blocks); link "
            f"{setup.hardware.h2d_gbps:g} GB/s; batch <= {config.max_running}",
        )

    def replay(
        name: str, scaled: list[TraceRequest], scale: float, progress: Progress
    ) -> LongctxRun:
        policy = make_longctx_policy(name, offload, design_tokens=design)
        run = LongctxEngine(config, policy, setup.cost, scaled).run(progress=progress)
        run.result.config.update(
            {
                **_wired_config(args, setup, LONG_CONTEXT, name, scale),
                "slo_tbt_s": config.slo.tbt_s,
                "slo_scale": args.slo_scale,
                "max_running": config.max_running,
                "num_layers": config.num_layers,
                "gpu_layer_blocks": config.gpu_block_budget,
                "layer_block_bytes": config.layer_block_bytes,
                "link_layer_blocks_per_s": config.link_blocks_per_s,
                "offload_time_limit_s": params.time_limit_s,
                "offload_node_limit": params.node_limit,
                "offload_stagger_requests": params.stagger_requests,
                "offload_spread_moves": params.spread_moves,
                "offload_ilp_work_limit": params.ilp_work_limit,
                "offload_backend": str(params.backend),
                "flexgen_design_tokens": design,
            }
        )
        return run

    return _replay_wired(asked, replay, report=report, outputs=_LONGCTX_OUTPUTS)


class _WiredRun(Protocol):
    @property
    def result(self) -> ReplayResult: ...


class _WiredMetrics(Protocol):
    @property
    def metrics(self) -> PolicyMetrics: ...


WiredRunT = TypeVar("WiredRunT", bound=_WiredRun)
WiredMetricsT = TypeVar("WiredMetricsT", bound=_WiredMetrics)


@dataclass(frozen=True, slots=True)
class _WiredOutputs(Generic[WiredRunT, WiredMetricsT]):
    """What a topology whose runs carry a ReplayResult and whose metrics a
    PolicyMetrics (long-context, cluster) reports: its metrics per run, the
    section it adds to each run's summary (key, content), its JSON document,
    and what its plots show (it swaps nothing out: no rotary requests)."""

    summarize: Callable[[WiredRunT], WiredMetricsT]
    section: str
    section_of: Callable[[WiredMetricsT], dict[str, Any]]
    document: Callable[[list[WiredRunT], list[WiredMetricsT]], dict[str, Any]]
    kv_unit: str
    stall: bool = False


_LONGCTX_OUTPUTS = _WiredOutputs(
    summarize_longctx,
    "offload",
    LongctxMetrics.offload_json,
    longctx_json,
    kv_unit="layer blocks",
    stall=True,
)
_CLUSTER_OUTPUTS = _WiredOutputs(
    summarize_cluster,
    "cluster",
    ClusterMetrics.cluster_json,
    cluster_json,
    kv_unit="blocks, all instances",
)


def _wired_config(
    args: argparse.Namespace, setup: ReplaySetup, topology: str, policy: str, scale: float
) -> dict[str, Any]:
    """The entries a wired topology's run config starts with: the setup,
    the topology, the policy, the rate scale and the noise."""
    return {
        **setup.describe(),
        "topology": topology,
        "policy": policy,
        "rate_scale": scale,
        "compute_jitter_cv": args.compute_jitter,
        "seed": args.seed,
    }


def _replay_wired(
    asked: _Invocation,
    replay: Callable[[str, list[TraceRequest], float, Progress], WiredRunT],
    *,
    report: Callable[[list[WiredMetricsT], float], None],
    outputs: _WiredOutputs[WiredRunT, WiredMetricsT],
) -> int:
    """_sweep and _write_outputs for a topology wired on the shared replay
    records (long-context, cluster)."""
    runs = _sweep(
        asked,
        replay,
        summarize=lambda done: [outputs.summarize(run) for run in done],
        result_of=lambda run: run.result,
        summary_of=lambda m: {**m.metrics.to_json(), outputs.section: outputs.section_of(m)},
        report=report,
    )
    results = [run.result for run in runs.runs]
    metrics = [m.metrics for m in runs.metrics]
    sweep = (
        {scale: [m.metrics for m in point] for scale, point in runs.by_scale.items()}
        if len(asked.scales) > 1
        else None
    )
    return _write_outputs(
        asked.args,
        runs,
        document=lambda: outputs.document(runs.runs, runs.metrics),
        plots=lambda folder: write_report(
            folder,
            results,
            metrics,
            sweep=sweep,
            kv_unit=outputs.kv_unit,
            rotary=False,
            stall=outputs.stall,
        ),
    )


def _run_cluster(asked: _Invocation, setup: ReplaySetup) -> int:
    """The cluster topology (planner.replay.cluster_engine)."""
    args, trace = asked.args, asked.trace
    defaults = ClusterKnobs()
    restore = defaults.restore
    if args.restore_hold is not None:
        restore = replace(restore, hold_s=args.restore_hold)
    knobs = replace(
        defaults,
        instances=args.instances if args.instances is not None else defaults.instances,
        kv_bytes_per_instance=int(args.gpu_kv_gb * 1e9) if args.gpu_kv_gb is not None else None,
        link_gbps=args.link_gbps if args.link_gbps is not None else defaults.link_gbps,
        static_group_size=(
            args.static_group_size
            if args.static_group_size is not None
            else min(defaults.static_group_size, args.instances or defaults.instances)
        ),
        restore=restore,
        jitter_cv=args.compute_jitter,
        seed=args.seed,
    )
    try:
        config = cluster_config(setup, knobs)
    except ValueError as exc:
        return _fail(str(exc))

    def report(metrics: list[ClusterMetrics], scale: float) -> None:
        kv_gb = config.kv_blocks_per_instance * config.block_bytes / 1e9
        print_cluster_report(
            metrics,
            title=f"Cluster replay of {args.trace} ({len(trace):,} requests, rate x{scale:g}, "
            f"{config.instances} x {setup.model.name} on {setup.hardware.name})",
            caption=f"SLO TTFT {config.slo.ttft_s:g} s, TBT {config.slo.tbt_s * 1e3:g} ms; KV "
            f"{kv_gb:.3g} GB and parameters {config.param_bytes / 1e9:.3g} GB per instance; "
            f"link {config.link_gbps:g} GB/s",
        )

    def replay(
        name: str, scaled: list[TraceRequest], scale: float, progress: Progress
    ) -> ClusterRun:
        engine = ClusterEngine(config, name, setup.cost, scaled)
        run = engine.run(progress=progress)
        run.result.config.update(
            {
                **_wired_config(args, setup, CLUSTER, name, scale),
                "instances": config.instances,
                "kv_blocks_per_instance": config.kv_blocks_per_instance,
                "param_bytes": config.param_bytes,
                "link_gbps": config.link_gbps,
                "reload_gbps": config.reload_gbps,
                "static_group_size": config.static_group_size,
                "restore_hold_s": config.restore.hold_s,
                "restore_low_watermark": config.restore.low_watermark,
                "trigger_horizon_s": config.trigger.horizon_s,
                "monitor_interval_s": config.monitor_interval_s,
                "group_throughput": list(engine.profile.group_throughput),
            }
        )
        return run

    return _replay_wired(asked, replay, report=report, outputs=_CLUSTER_OUTPUTS)


def _run_serverless(asked: _Invocation, setup: ReplaySetup) -> int:
    """The serverless topology (planner.replay.serverless_engine)."""
    args, trace = asked.args, asked.trace
    defaults = ServerlessKnobs()
    knobs = replace(
        defaults,
        mig=args.mig if args.mig is not None else defaults.mig,
        c2c_gbps=args.c2c_gbps if args.c2c_gbps is not None else defaults.c2c_gbps,
        load_link=args.load_link,
        switch_setup_s=(
            args.switch_setup if args.switch_setup is not None else defaults.switch_setup_s
        ),
        urgent_slack_s=args.urgent_slack,
        max_models_per_slice=(
            args.models_per_slice
            if args.models_per_slice is not None
            else defaults.max_models_per_slice
        ),
        min_hold_s=args.min_hold,
        victim_slack_s=args.victim_slack,
        starve_after_s=args.starve_after,
        max_drain_s=args.max_drain,
        seed=args.seed,
        jitter_cv=args.compute_jitter,
        share_max_in_flight=(
            args.share_max_in_flight
            if args.share_max_in_flight is not None
            else defaults.share_max_in_flight
        ),
        disk_gbps=args.disk_gbps,
        host_memory_gb=(
            args.host_memory_gb if args.host_memory_gb is not None else defaults.host_memory_gb
        ),
    )
    try:
        config = serverless_config(setup, knobs)
    except ValueError as exc:
        return _fail(str(exc))

    def replay(
        name: str, scaled: list[TraceRequest], scale: float, progress: Progress
    ) -> ServerlessRun:
        # The report plots the first rate scale's timelines.
        plotted = args.report_dir is not None and scale == asked.scales[0]
        run = ServerlessEngine(config, name, scaled, records_timeline=plotted).run(
            progress=progress
        )
        run.result.config.update(
            {
                "topology": SERVERLESS,
                "policy": name,
                "model": setup.model.name,
                "rate_scale": scale,
                "seed": args.seed,
                **describe(config, name),
            }
        )
        return run

    def report(metrics: list[ServerlessMetrics], scale: float) -> None:
        models = len({t.model for t in trace})
        print_serverless_report(
            metrics,
            title=f"Serverless replay of {args.trace} ({len(trace):,} requests, {models} "
            f"models, rate x{scale:g}, {setup.model.name} architecture)",
            caption=f"SLO TTFT {config.slo.ttft_s:g} s, TPOT {config.slo.tbt_s * 1e3:g} ms; "
            f"{len(config.slices)} x {config.slices[0].name}; C2C {config.link_gbps:g} GB/s; "
            f"preemption: urgent at {config.preemption.urgent_slack_s:g} s of slack, hold "
            f"{config.preemption.min_hold_s:g} s, victim slack "
            f"{config.preemption.victim_slack_s:g} s, starving after "
            f"{config.preemption.starve_after_s:g} s (drain at most "
            f"{config.preemption.max_drain_s:g} s); {config.max_models_per_slice} models per "
            "slice",
        )

    runs = _sweep(
        asked,
        replay,
        summarize=compare_serverless,
        result_of=lambda run: run.result,
        summary_of=lambda m: {**m.metrics.to_json(), "serverless": m.serverless_json()},
        report=report,
    )
    sweep = runs.by_scale if len(asked.scales) > 1 else None
    if sweep is not None:
        print_table(serverless_sweep_table(sweep))
    return _write_outputs(
        args,
        runs,
        document=lambda: serverless_json(runs.runs, runs.metrics, sweep),
        plots=lambda folder: write_serverless_report(
            folder, runs.runs, runs.metrics, sweep=runs.by_scale
        ),
    )
