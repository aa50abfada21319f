"""Plugin on and off on a real vLLM server, back to back on the same load:
both-met attainment (TTFT and TPOT SLOs), output tokens/s, the latency tails,
vLLM's preemptions, and the adapter's own numbers from vLLM's /metrics
(planner calls, calls over the deadline, swaps). Runs in the engine
environment (`make bench-vllm`):

    python -m planner.bench.vllm_compare --out out/bench-vllm [--markdown docs/adapters.md]

Each load runs its configurations in turn (plain vLLM, then the plugin over
gRPC and in process, each with the planner call pipelined, its default, and
synchronous), --repeat times, interleaved, on identical arrivals; the
machine's load average is recorded before and after each run, since a
shared machine moves every number."""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from planner.adapters.common.counters import LATENCY_BUCKETS_S
from planner.bench.calibration_loads import CalibrationLoad
from planner.bench.core_pinning import pinned_here
from planner.bench.http_load import (
    BurstyLoad,
    LoadRequest,
    LongDecodesLoad,
    RequestRecord,
    run_load,
)
from planner.bench.machine import describe, describe_commit, machine_info
from planner.bench.markdown import write_section
from planner.bench.server_process import ServerProcess, add_planner_arg_option
from planner.bench.tiny_llama import cached
from planner.bench.vllm_placement import (
    Placement,
    autogroups_in_effect,
    parse_cpus,
    place_planner,
    place_vllm,
)
from planner.bench.vllm_server import VllmServer, VllmServerConfig

SECTION = "vllm-plugin"
# The plugin's configurations: where the planner runs, how each step's plan
# is asked for (additional_config.planner.planning), and whether the swap
# connector is on (off: every preemption, the planner's and vLLM's, is by
# recompute, vLLM's own way; the planner's counters are then not on /metrics).
# Each: where the planner runs, the planning mode, whether the swap
# connector is on, and other adapter settings. *-observe: plans asked for
# and logged, never applied (the adapter's cost without its decisions);
# *-reorder-always: the plan's order of the waiting queue applied at every
# step, not only with its preemptions (the adapter before that rule);
# *-swap-engine: vLLM's own preemptions swapped by the connector too, not
# only the planner's (the adapter before engine_preemptions).
PLUGIN_CONFIGS: dict[str, tuple[str, str, bool, dict[str, Any]]] = {
    "grpc": ("grpc", "pipelined", True, {}),
    "grpc-sync": ("grpc", "synchronous", True, {}),
    "in-process": ("in-process", "pipelined", True, {}),
    "in-process-sync": ("in-process", "synchronous", True, {}),
    "in-process-recompute": ("in-process", "pipelined", False, {}),
    "in-process-observe": ("in-process", "pipelined", True, {"apply_plans": False}),
    "grpc-observe": ("grpc", "pipelined", True, {"apply_plans": False}),
    # The pipelined call started as gRPC's own future on the engine's
    # thread instead of handed to a sending thread (pipelined_send).
    "grpc-observe-future": (
        "grpc",
        "pipelined",
        True,
        {"apply_plans": False, "pipelined_send": "grpc-future"},
    ),
    # Each gRPC call's moments, the adapter's and the server's, logged per
    # call (call_timing_log: *.call-timing.jsonl beside the run's log; see
    # planner.bench.call_timing_report).
    "grpc-observe-timed": (
        "grpc",
        "pipelined",
        True,
        {"apply_plans": False, "call_timing_log": True},
    ),
    "grpc-timed": ("grpc", "pipelined", True, {"call_timing_log": True}),
    "in-process-reorder-always": ("in-process", "pipelined", True, {"reorder": "always"}),
    "grpc-reorder-always": ("grpc", "pipelined", True, {"reorder": "always"}),
    "grpc-swap-engine": ("grpc", "pipelined", True, {"engine_preemptions": "swap"}),
    "in-process-swap-engine": ("in-process", "pipelined", True, {"engine_preemptions": "swap"}),
    # Victims need 20 TBT SLOs of TPOT slack instead of the planner's 160:
    # rotation starts while long decodes are still young.
    "grpc-slack-20": ("grpc", "pipelined", True, {"rotation": {"preempt_slack_tbts": 20}}),
    "in-process-slack-20": (
        "in-process",
        "pipelined",
        True,
        {"rotation": {"preempt_slack_tbts": 20}},
    ),
}
CONFIGS = ("plain", *PLUGIN_CONFIGS)
# vLLM's CPU backend reserves an extra core for any KV connector; this one
# needs none (docs/adapters.md).
ENV = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}


@dataclass(frozen=True, slots=True)
class CalibrationLoadRequests:
    """One of `planner bench calibration`'s loads, served here."""

    load: CalibrationLoad

    def requests(self) -> list[LoadRequest]:
        return [
            LoadRequest(r.id, r.send_at_s, r.prompt, r.max_tokens)
            for r in self.load.requests(salt=0)
        ]


@dataclass(frozen=True, slots=True)
class LoadCase:
    name: str
    # KV blocks of 32 tokens.
    num_gpu_blocks: int
    load: BurstyLoad | LongDecodesLoad | CalibrationLoadRequests
    what: str
    # The TTFT SLO of this load (judged and sent to the planner); None:
    # --slo-ttft-s.
    slo_ttft_s: float | None = None
    # Its TPOT (TBT) SLO; None: --slo-tpot-s.
    slo_tpot_s: float | None = None


LOADS = {
    "bursty": LoadCase(
        "bursty",
        512,
        BurstyLoad(num_bursts=4, burst_size=50, burst_gap_s=5.0),
        "200 requests in 4 bursts, 16k tokens of KV (little preemption)",
    ),
    "kv-pressure": LoadCase(
        "kv-pressure",
        64,
        BurstyLoad(num_bursts=4, burst_size=50, burst_gap_s=5.0),
        "the same 200 requests on 2k tokens of KV (the e2e test's load)",
    ),
    "long-decodes": LoadCase(
        "long-decodes",
        64,
        LongDecodesLoad(),
        "4 long requests (about 410 prompt tokens, 440-520 output tokens) holding most of "
        "2k tokens of KV while 60 short ones (30-60 words, 16-32 tokens) arrive one every "
        "0.2 s from 1 s on",
        slo_ttft_s=1.0,
    ),
    "long-decodes-tight": LoadCase(
        "long-decodes-tight",
        40,
        LongDecodesLoad(),
        "long-decodes on 1.25k tokens of KV: three of the long requests fill it, the short "
        "ones queue behind them",
        slo_ttft_s=1.0,
    ),
    # The calibration's rotation load run twice as long: the replay
    # (fcfs-vllm against lvf-vllm, the profile of this tiny model) predicts
    # 90.2 % against 98.9 % both-met at equal tokens/s (docs/adapters.md).
    "long-bursts": LoadCase(
        "long-bursts",
        128,
        CalibrationLoadRequests(
            CalibrationLoad(
                "long-bursts",
                "",
                rate_rps=2.0,
                duration_s=30.0,
                num_bursts=6,
                burst_size=7,
                burst_prompt_words=(280, 360),
                burst_output_tokens=(400, 500),
            )
        ),
        "6 bursts of 7 long requests (280-360 words, 400-500 tokens) 5 s apart over Poisson "
        "short ones (40-200 words, 16-96 tokens) at 2/s for 30 s, on 4k tokens of KV: the "
        "long decodes fill it and vLLM's preempted long requests hold up the short ones at "
        "the head of its queue",
        slo_ttft_s=0.25,
        slo_tpot_s=0.05,
    ),
}


@dataclass(slots=True)
class RunResult:
    load: str
    config: str
    repeat: int
    wall_s: float
    requests: int
    completed: int
    output_tokens: int
    output_tok_s: float
    ttft_attainment: float
    tpot_attainment: float
    both_attainment: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tbt_p99_s: float
    preemptions: float
    planner_calls: float = 0.0
    planner_answers: float = 0.0
    fallbacks: dict[str, float] = field(default_factory=dict)
    # Calls whose latency exceeded the deadline, from the adapter's histogram
    # (its bucket bound at the deadline).
    calls_over_deadline: float = 0.0
    call_mean_ms: float = math.nan
    # What the engine's steps waited for the planner: the whole call when it
    # is synchronous, what was left of it at the next step when pipelined.
    wait_mean_ms: float = math.nan
    waits_over_deadline: float = 0.0
    swap_outs: float = 0.0
    swap_ins: float = 0.0
    load_average_before: float = math.nan
    load_average_after: float = math.nan
    placement: str = ""


def _pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def _sum(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    return sum(v for n, lab, v in samples if n == name and labels.items() <= lab.items())


def summarize(
    *,
    load: str,
    config: str,
    repeat: int,
    records: list[RequestRecord],
    wall_s: float,
    metrics_text: str,
    slo_ttft_s: float,
    slo_tpot_s: float,
    deadline_s: float,
) -> RunResult:
    done = [r for r in records if r.done]
    ttft = [r.ttft_s for r in done if r.ttft_s is not None]
    tpot = [r.tpot_s for r in done if r.tpot_s is not None]
    n = len(records)
    ttft_ok = [r.ttft_s is not None and r.ttft_s <= slo_ttft_s for r in records]
    tpot_ok = [r.tpot_s is None or r.tpot_s <= slo_tpot_s for r in records]
    both = [r.done and a and b for r, a, b in zip(records, ttft_ok, tpot_ok, strict=True)]
    tokens = sum(r.completion_tokens for r in done)
    m = _samples(metrics_text)
    calls = _sum(m, "planner_adapter_calls_total")
    within = _sum(m, "planner_adapter_call_duration_seconds_bucket", le=f"{deadline_s}")
    latency_sum = _sum(m, "planner_adapter_call_duration_seconds_sum")
    waits = _sum(m, "planner_adapter_step_wait_seconds_count")
    waits_within = _sum(m, "planner_adapter_step_wait_seconds_bucket", le=f"{deadline_s}")
    wait_sum = _sum(m, "planner_adapter_step_wait_seconds_sum")
    fallbacks: dict[str, float] = {}
    for name, labels, value in m:
        if name == "planner_adapter_fallbacks_total" and value:
            fallbacks[labels["reason"]] = fallbacks.get(labels["reason"], 0.0) + value
    return RunResult(
        load=load,
        config=config,
        repeat=repeat,
        wall_s=wall_s,
        requests=n,
        completed=len(done),
        output_tokens=tokens,
        output_tok_s=tokens / wall_s if wall_s > 0 else math.nan,
        ttft_attainment=sum(ttft_ok) / n,
        tpot_attainment=sum(tpot_ok) / n,
        both_attainment=sum(both) / n,
        ttft_p50_s=_pct(ttft, 0.5),
        ttft_p99_s=_pct(ttft, 0.99),
        tpot_p50_s=_pct(tpot, 0.5),
        tbt_p99_s=_pct([x for r in done for x in r.tbt_s], 0.99),
        preemptions=_sum(m, "vllm:num_preemptions_total"),
        planner_calls=calls,
        planner_answers=_sum(m, "planner_adapter_answers_total"),
        fallbacks=fallbacks,
        calls_over_deadline=calls - within if calls else 0.0,
        call_mean_ms=1e3 * latency_sum / calls if calls else math.nan,
        wait_mean_ms=1e3 * wait_sum / waits if waits else math.nan,
        waits_over_deadline=waits - waits_within if waits else 0.0,
        swap_outs=_sum(m, "planner_swap_outs_total"),
        swap_ins=_sum(m, "planner_swap_ins_total"),
    )


def run_one(
    case: LoadCase,
    *,
    config: str,
    repeat: int,
    model_dir: Path,
    port: int,
    planner_target: str | None,
    args: argparse.Namespace,
    log_dir: Path,
    placement: Placement | None = None,
) -> RunResult:
    placement = placement or Placement()
    on = config != "plain"
    planner: dict[str, Any] = {
        "slo_ttft_s": slo_ttft_s(case, args),
        "slo_tbt_s": slo_tpot_s(case, args),
        "deadline_ms": args.deadline_ms,
    }
    swap = on
    if on:
        where, planning, swap, extra = PLUGIN_CONFIGS[config]
        planner["planning"] = planning
        planner.update(extra)
        if args.decision_log:
            planner["decision_log"] = str(
                (log_dir / f"{case.name}-{config}-{repeat}.decisions.jsonl").resolve()
            )
        if planner.get("call_timing_log") is True:
            planner["call_timing_log"] = str(
                (log_dir / f"{case.name}-{config}-{repeat}.call-timing.jsonl").resolve()
            )
        if where == "grpc":
            planner["target"] = planner_target
        if args.rotation is not None:
            planner["rotation"] = {**planner.get("rotation", {}), **args.rotation}
    server_config = VllmServerConfig(
        model_dir=model_dir,
        port=port,
        num_gpu_blocks=case.num_gpu_blocks,
        scheduler=on,
        connector=swap,
        planner=planner if on else {},
        env={**ENV, **placement.vllm_env(), **args.env},
    )
    log = log_dir / f"{case.name}-{config}-{repeat}.log"
    with VllmServer(server_config, log_path=log, python=args.python) as server:
        place_vllm(server.pid, placement)
        before = os.getloadavg()[0]
        with pinned_here(placement.frontend):
            start = time.perf_counter()
            records = run_load(server.url, str(model_dir), case.load.requests())
            wall_s = time.perf_counter() - start
        after = os.getloadavg()[0]
        text = server.metrics_text()
    result = summarize(
        load=case.name,
        config=config,
        repeat=repeat,
        records=records,
        wall_s=wall_s,
        metrics_text=text,
        slo_ttft_s=slo_ttft_s(case, args),
        slo_tpot_s=slo_tpot_s(case, args),
        deadline_s=args.deadline_ms / 1e3,
    )
    result.load_average_before = before
    result.load_average_after = after
    result.placement = "" if placement == Placement() else placement.describe()
    outputs = {r.id: r.text for r in records}
    (log_dir / f"{case.name}-{config}-{repeat}.outputs.json").write_text(
        json.dumps(outputs), encoding="utf-8"
    )
    timings = {r.id: {"ttft_s": r.ttft_s, "tpot_s": r.tpot_s} for r in records}
    (log_dir / f"{case.name}-{config}-{repeat}.timings.json").write_text(
        json.dumps(timings), encoding="utf-8"
    )
    return result


def free_port() -> int:
    """A port nothing listens on now (another vLLM on a fixed port would
    answer this one's health check)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def slo_ttft_s(case: LoadCase, args: argparse.Namespace) -> float:
    return case.slo_ttft_s if case.slo_ttft_s is not None else float(args.slo_ttft_s)


def slo_tpot_s(case: LoadCase, args: argparse.Namespace) -> float:
    return case.slo_tpot_s if case.slo_tpot_s is not None else float(args.slo_tpot_s)


def _median(results: list[RunResult], attr: str) -> float:
    values = [getattr(r, attr) for r in results]
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else math.nan


def markdown(results: list[RunResult], args: argparse.Namespace, machine: dict[str, Any]) -> str:
    rotation = (
        f" --rotation '{json.dumps(args.rotation, separators=(',', ':'))}'"
        if args.rotation is not None
        else ""
    )
    lines = [
        "Command: `make bench-vllm` (`python -m planner.bench.vllm_compare "
        f"--repeat {args.repeat} --deadline-ms {args.deadline_ms:g} "
        f"--slo-ttft-s {args.slo_ttft_s:g} --slo-tpot-s {args.slo_tpot_s:g}{rotation}`), "
        f"medians of {args.repeat} interleaved run(s). Machine: {describe(machine)}; "
        f"{describe_commit(machine)}. The 1-minute load average before and after each run "
        "is in the last column: on a shared machine every number moves with it. "
        f"Over {args.deadline_ms:g} ms: calls whose latency (sent to answered) passed "
        "the deadline; late: steps that ran vLLM's own policy because the answer was not "
        "there in time (a `deadline` fallback); stale: pipelined plans that no longer fit "
        "when they arrived; wait: what each step waited for the planner.",
        "",
    ]
    for name in dict.fromkeys(r.load for r in results):
        case = LOADS[name]
        lines += [
            f"**{name}**: {case.what}; TTFT SLO {slo_ttft_s(case, args):g} s, "
            f"TPOT SLO {slo_tpot_s(case, args):g} s.",
            "",
            "| configuration | done | wall s | out tok/s | both met | TTFT met | TPOT met "
            "| TTFT p50 / p99 s | TPOT p50 s | TBT p99 s | preemptions | swaps out/in "
            f"| planner calls | over {args.deadline_ms:g} ms | late | stale | mean call ms "
            "| mean wait ms | load avg |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for config in dict.fromkeys(r.config for r in results if r.load == name):
            rs = [r for r in results if r.load == name and r.config == config]

            def med(attr: str, rs: list[RunResult] = rs) -> float:
                return _median(rs, attr)

            def fallbacks(reason: str, rs: list[RunResult] = rs) -> float:
                return statistics.median(r.fallbacks.get(reason, 0.0) for r in rs)

            calls = med("planner_calls")
            planner = (
                f"| {med('swap_outs'):.0f}/{med('swap_ins'):.0f} | {calls:.0f} "
                f"| {_share(med('calls_over_deadline'), calls)} "
                f"| {_share(fallbacks('deadline'), calls)} "
                f"| {_share(fallbacks('stale-plan'), calls)} "
                f"| {med('call_mean_ms'):.2f} | {med('wait_mean_ms'):.2f} "
                if calls
                else "| - | - | - | - | - | - | - "
            )
            lines.append(
                f"| {config} | {med('completed'):.0f}/{med('requests'):.0f} "
                f"| {med('wall_s'):.1f} | {med('output_tok_s'):.0f} "
                f"| {100 * med('both_attainment'):.1f} % | {100 * med('ttft_attainment'):.1f} % "
                f"| {100 * med('tpot_attainment'):.1f} % "
                f"| {med('ttft_p50_s'):.2f} / {med('ttft_p99_s'):.2f} "
                f"| {med('tpot_p50_s'):.3f} | {med('tbt_p99_s'):.3f} | {med('preemptions'):.0f} "
                + planner
                + f"| {med('load_average_before'):.1f} to {med('load_average_after'):.1f} |"
            )
        lines.append("")
    return "\n".join(lines)


def _share(count: float, calls: float) -> str:
    return f"{count:.0f} ({100 * count / calls:.1f} %)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench-vllm"))
    parser.add_argument(
        "--model", type=Path, help="a tiny_llama folder (default: ~/.cache/planner-engines)"
    )
    parser.add_argument("--load", action="append", choices=sorted(LOADS), help="default: all")
    parser.add_argument("--config", action="append", choices=CONFIGS, help="default: all")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--deadline-ms", type=float, default=5.0)
    parser.add_argument("--slo-ttft-s", type=float, default=2.0)
    parser.add_argument("--slo-tpot-s", type=float, default=0.1)
    parser.add_argument(
        "--rotation",
        type=json.loads,
        help="the adapter's rotation setting, JSON (e.g. '{\"preempt_slack_tbts\": 20}')",
    )
    parser.add_argument(
        "--port", type=int, help="vLLM's port (default: a free one for each server)"
    )
    parser.add_argument(
        "--decision-log",
        action="store_true",
        help="each plugin run logs every step's plan and vLLM's own order (*.decisions.jsonl)",
    )
    parser.add_argument("--python", default=sys.executable, help="the engine environment's")
    parser.add_argument(
        "--worker-cpus",
        type=parse_cpus,
        help="vLLM's worker: one OpenMP thread bound to each of these CPUs (e.g. 0 or 0-3)",
    )
    parser.add_argument("--engine-core-cpus", type=parse_cpus, help="vLLM's engine core process")
    parser.add_argument(
        "--frontend-cpus", type=parse_cpus, help="vLLM's API server and this load client"
    )
    parser.add_argument("--planner-cpus", type=parse_cpus, help="the planner server")
    parser.add_argument(
        "--planner-autogroup-nice",
        type=int,
        help="the planner server in a session (scheduling autogroup) of its own, at this nice",
    )
    parser.add_argument(
        "--planner-nice",
        type=int,
        help="the nice value of every thread of the planner server (-20..19), in the autogroup "
        "it is in (the caller's unless --planner-autogroup-nice)",
    )
    add_planner_arg_option(parser)
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for vLLM (e.g. VLLM_CPU_KVCACHE_SPACE=1)",
    )
    parser.add_argument("--markdown", type=Path, help="write the table into this file's section")
    args = parser.parse_args(argv)
    env = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"--env takes NAME=VALUE, got {item!r}")
        env[name] = value
    args.env = env
    try:
        placement = Placement(
            worker=args.worker_cpus,
            engine_core=args.engine_core_cpus,
            frontend=args.frontend_cpus,
            planner=args.planner_cpus,
            planner_autogroup_nice=args.planner_autogroup_nice,
            planner_nice=args.planner_nice,
        )
    except ValueError as exc:
        parser.error(str(exc))
    if placement.planner_autogroup_nice is not None and not autogroups_in_effect():
        parser.error(
            "--planner-autogroup-nice: autogroup scheduling does not apply to this process "
            "(it is off, the process has no autogroup, or it is in a CPU cgroup of its own), "
            "so a group nice would change nothing"
        )
    if args.deadline_ms / 1e3 not in LATENCY_BUCKETS_S:
        # Calls over the deadline are read off the adapter's histogram.
        parser.error(f"--deadline-ms must be a latency bucket bound: {LATENCY_BUCKETS_S} s")
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = args.model or cached(Path.home() / ".cache" / "planner-engines")
    loads = [LOADS[n] for n in (args.load or LOADS)]
    configs = args.config or list(CONFIGS)
    results: list[RunResult] = []
    with ServerProcess(
        *args.planner_arg, new_session=placement.planner_autogroup_nice is not None
    ) as planner:
        place_planner(planner.pid, placement)
        for case in loads:
            for repeat in range(args.repeat):
                for config in configs:
                    result = run_one(
                        case,
                        config=config,
                        repeat=repeat,
                        model_dir=model_dir,
                        port=args.port or free_port(),
                        planner_target=planner.address,
                        args=args,
                        log_dir=args.out,
                        placement=placement,
                    )
                    results.append(result)
                    print(json.dumps(asdict(result)), flush=True)
    machine = machine_info()
    (args.out / "results.json").write_text(
        json.dumps({"machine": machine, "results": [asdict(r) for r in results]}, indent=1),
        encoding="utf-8",
    )
    table = markdown(results, args, machine)
    (args.out / "table.md").write_text(table, encoding="utf-8")
    print(table)
    if args.markdown is not None:
        write_section(args.markdown, SECTION, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
