"""`planner bench rotation-quality`: does serving get better when the rotation
policy decides? FCFS (vLLM V1's scheduler), the paper's Algorithm 1
(`lvf-paper`) and the bounded LVF replayed side by side, on identical
arrivals, over a matrix of settings:

- the bundled trace on llama-3-8b / H100 (PCIe) at rate x1 and x1.3;
- ShareGPT lengths at 10 rps and the first 120 s of the Mooncake
  conversation trace (both from ../shared/traces; skipped when absent);
- the bundled trace on llama-3-8b / GH200 at x1.5 and x2 (compute-bound);
- qwen2.5-32b / GH200 in the SuperInfer paper's setting (B_xfer 2400, 400 GB
  of CPU KV, 16,384 running slots and batched tokens, short single-turn
  prompts from our generator) at 25 and 30 rps;
- qwen2.5-32b / GH200 with conversation-length prompts (the sharegpt preset,
  mean 2.3k tokens) at 4 rps on the default engine (2,048 batched tokens,
  256 slots): KV and compute both under pressure.

Targets, per row: LVF's both-met attainment >= FCFS's, its token-level TBT
attainment >= FCFS's - 1 point, stall <= 2 % of simulated time; on the
bundled trace at x1 both-met >= 80 %; in the paper setting at 25 rps TTFT
attainment >= FCFS + 35 points with token-level TBT within 2 points.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from planner.bench.machine import describe, describe_commit, load_average, machine_info
from planner.bench.markdown import write_section
from planner.domain.rotation import RotationParams
from planner.replay.engine import Engine
from planner.replay.metrics import PolicyMetrics, summarize
from planner.replay.scheduler_by_name import make_scheduler
from planner.replay.setup import ReplayKnobs, build_setup, scale_rate
from planner.trace.arrivals import RateSchedule
from planner.trace.generate import GenConfig, generate
from planner.trace.importers.base import ImportOptions
from planner.trace.importers.pipeline import import_trace
from planner.trace.io import load_trace
from planner.trace.length_model import Independent, preset_or_dist
from planner.trace.lengths import parse_dist
from planner.trace.records import TraceRequest

SECTION = "rotation:quality"
POLICIES = ("fcfs", "lvf-paper", "lvf")
REPO_ROOT = Path(__file__).resolve().parents[2]
BUNDLED = REPO_ROOT / "fixtures" / "traces" / "default.jsonl"
SHARED_TRACES = REPO_ROOT.parent / "shared" / "traces"
SHAREGPT = SHARED_TRACES / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
MOONCAKE = SHARED_TRACES / "mooncake_conversation_trace.jsonl"
H100 = "llama-3-8b@h100-sxm-80gb"
GH200_8B = "llama-3-8b@gh200-144gb"
GH200_32B = "qwen2.5-32b@gh200-144gb"
# The paper's link budget and CPU memory on the default engine.
GH200_KNOBS = ReplayKnobs(
    rotation=RotationParams(transfer_budget_blocks=2400), cpu_kv_bytes=400 * 10**9
)
# The paper's engine (SuperInfer §5.1 and its artifact's flags).
PAPER_KNOBS = ReplayKnobs(
    rotation=RotationParams(transfer_budget_blocks=2400),
    max_running=16384,
    max_batched_tokens=16384,
    cpu_kv_bytes=400 * 10**9,
)
SHORT_PROMPTS = "lognormal:median=110,sigma=1.2,max=1024"
SHORT_OUTPUTS = "lognormal:median=200,sigma=1.0,max=2048"
# Target thresholds, in attainment fractions.
TBT_SLACK = 0.01
STALL_MOST = 0.02
BUNDLED_BOTH_LEAST = 0.80
PAPER_TTFT_GAIN = 0.35
PAPER_TBT_SLACK = 0.02


@dataclass(frozen=True, slots=True)
class MatrixRow:
    name: str
    profile: str
    trace: str  # how the trace is made, for the docs
    load: Callable[[], list[TraceRequest] | None]
    knobs: ReplayKnobs = field(default_factory=ReplayKnobs)
    # Extra targets of this row: both-met at least, TTFT gain at least.
    both_least: float | None = None
    ttft_gain_least: float | None = None
    tbt_slack: float = TBT_SLACK


def _bundled(scale: float) -> Callable[[], list[TraceRequest] | None]:
    return lambda: scale_rate(load_trace(BUNDLED), scale)


def _sharegpt() -> list[TraceRequest] | None:
    if not SHAREGPT.is_file():
        return None
    options = ImportOptions(duration_s=120.0, schedule=RateSchedule.constant(10.0), seed=0)
    return import_trace("sharegpt-lengths", SHAREGPT, options)[0]


def _mooncake() -> list[TraceRequest] | None:
    if not MOONCAKE.is_file():
        return None
    return import_trace("mooncake", MOONCAKE, ImportOptions(duration_s=120.0))[0]


def _sharegpt_preset(rate: float) -> Callable[[], list[TraceRequest] | None]:
    config = GenConfig(
        schedule=RateSchedule.constant(rate),
        lengths=preset_or_dist("sharegpt"),
        duration_s=120.0,
        seed=0,
    )
    return lambda: generate(config)


def _short(rate: float) -> Callable[[], list[TraceRequest] | None]:
    lengths = Independent(parse_dist(SHORT_PROMPTS), parse_dist(SHORT_OUTPUTS))
    config = GenConfig(
        schedule=RateSchedule.constant(rate), lengths=lengths, duration_s=120.0, seed=0
    )
    return lambda: generate(config)


def matrix() -> list[MatrixRow]:
    short = (
        f"generated: {{rate}} rps Poisson, 120 s, prompts {SHORT_PROMPTS}, outputs {SHORT_OUTPUTS}"
    )
    return [
        MatrixRow(
            "bundled x1",
            H100,
            "fixtures/traces/default.jsonl",
            _bundled(1.0),
            both_least=BUNDLED_BOTH_LEAST,
        ),
        MatrixRow("bundled x1.3", H100, "fixtures/traces/default.jsonl, rate x1.3", _bundled(1.3)),
        MatrixRow(
            "ShareGPT 10 rps",
            H100,
            "ShareGPT lengths (sarathi-serve stats), 10 rps Poisson, 120 s, seed 0",
            _sharegpt,
        ),
        MatrixRow("Mooncake 120 s", H100, "Mooncake conversation trace, first 120 s", _mooncake),
        MatrixRow(
            "GH200 8B x1.5", GH200_8B, "fixtures/traces/default.jsonl, rate x1.5", _bundled(1.5)
        ),
        MatrixRow("GH200 8B x2", GH200_8B, "fixtures/traces/default.jsonl, rate x2", _bundled(2.0)),
        MatrixRow(
            "paper 25 rps",
            GH200_32B,
            short.format(rate=25),
            _short(25.0),
            PAPER_KNOBS,
            ttft_gain_least=PAPER_TTFT_GAIN,
            tbt_slack=PAPER_TBT_SLACK,
        ),
        MatrixRow("paper 30 rps", GH200_32B, short.format(rate=30), _short(30.0), PAPER_KNOBS),
        MatrixRow(
            "GH200 32B long 4 rps",
            GH200_32B,
            "generated: 4 rps Poisson, 120 s, sharegpt preset lengths, seed 0",
            _sharegpt_preset(4.0),
            GH200_KNOBS,
        ),
    ]


@dataclass(frozen=True, slots=True)
class RowResult:
    row: MatrixRow
    requests: int
    metrics: dict[str, PolicyMetrics]

    def targets(self) -> list[tuple[str, bool, str]]:
        """(target, met, the measured numbers) for this row."""
        fcfs, lvf = self.metrics["fcfs"], self.metrics["lvf"]
        out = [
            (
                "both-met >= FCFS",
                _pct(lvf.both_attainment) >= _pct(fcfs.both_attainment),
                f"{_fmt(lvf.both_attainment)} vs {_fmt(fcfs.both_attainment)}",
            ),
            (
                f"TBT >= FCFS - {self.row.tbt_slack * 100:g} pt",
                _pct(lvf.tbt_attainment) >= _pct(fcfs.tbt_attainment) - self.row.tbt_slack * 100,
                f"{_fmt(lvf.tbt_attainment)} vs {_fmt(fcfs.tbt_attainment)}",
            ),
            (
                f"stall <= {STALL_MOST:.0%}",
                (lvf.stall_fraction or 0.0) <= STALL_MOST,
                _fmt(lvf.stall_fraction, 2),
            ),
        ]
        if self.row.both_least is not None:
            out.append(
                (
                    f"both-met >= {self.row.both_least:.0%}",
                    (lvf.both_attainment or 0.0) >= self.row.both_least,
                    _fmt(lvf.both_attainment),
                )
            )
        if self.row.ttft_gain_least is not None:
            gain = _pct(lvf.ttft_attainment) - _pct(fcfs.ttft_attainment)
            out.append(
                (
                    f"TTFT >= FCFS + {self.row.ttft_gain_least * 100:g} pt",
                    gain >= self.row.ttft_gain_least * 100,
                    f"{_fmt(lvf.ttft_attainment)} vs {_fmt(fcfs.ttft_attainment)} (+{gain:.1f} pt)",
                )
            )
        return out


def _pct(value: float | None) -> float:
    """An attainment in percent, rounded as the table shows it."""
    return round(100.0 * (value or 0.0), 1)


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{100.0 * value:.{digits}f}%"


def on_machine(profile: str, machine: Path) -> str:
    """``model@machine`` with the machine replaced by a profile file."""
    return f"{profile.split('@', 1)[0]}@{machine}"


def run_row(row: MatrixRow, trace: list[TraceRequest]) -> RowResult:
    setup = build_setup(row.profile, row.knobs)
    metrics = {}
    for policy in POLICIES:
        engine = Engine(
            setup.engine, make_scheduler(policy, setup.rotation), setup.cost, setup.link, trace
        )
        metrics[policy] = summarize(engine.run())
    return RowResult(row, len(trace), metrics)


def register(benches: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = benches.add_parser(
        "rotation-quality",
        help="FCFS, the paper's LVF and the bounded LVF over a matrix of settings",
        description="Replay FCFS, lvf-paper and lvf side by side on a matrix of traces, "
        "models and machines, and mark the rotation policy's targets MET or MISSED: "
        "goodput (TTFT and TPOT met) and token-level TBT against FCFS, stalls, the bundled "
        "trace's goodput and the paper setting's TTFT gain.",
    )
    p.add_argument("--row", action="append", help="run only rows whose name contains this")
    p.add_argument("--out", type=Path, help="write every number as JSON")
    p.add_argument("--markdown", type=Path, help="(re)write this bench's section of this file")
    p.add_argument(
        "--machine",
        type=Path,
        help="replay every selected row on this profile file's machine (a measured "
        "planner-profile/1, e.g. from planner.bench.kernels_gpu) instead of its built-in one",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    rows = [r for r in matrix() if not args.row or any(s in r.name for s in args.row)]
    if not rows:
        print("planner bench rotation-quality: no row matches --row", file=sys.stderr)
        return 2
    if args.machine is not None:
        if args.markdown is not None:
            print(
                "planner bench rotation-quality: --markdown writes the built-in matrix's "
                "section; it cannot be combined with --machine",
                file=sys.stderr,
            )
            return 2
        if not args.machine.is_file():
            print(f"planner bench rotation-quality: --machine: no file {args.machine}",
                  file=sys.stderr)  # fmt: skip
            return 2
        rows = [replace(r, profile=on_machine(r.profile, args.machine)) for r in rows]
    machine = machine_info()
    results: list[RowResult] = []
    skipped: list[str] = []
    for row in rows:
        trace = row.load()
        if trace is None:
            print(f"bench: {row.name}: its trace is absent, skipped", file=sys.stderr)
            skipped.append(row.name)
            continue
        print(f"bench: {row.name} ({len(trace):,} requests)", file=sys.stderr, flush=True)
        results.append(run_row(row, trace))
    machine["load_avg_1m_at_end"] = load_average()
    command = "planner bench rotation-quality" + "".join(f" --row '{s}'" for s in args.row or ())
    if args.machine is not None:
        command += f" --machine {args.machine}"
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(text_table(results))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "bench": "rotation/quality",
            "date": date,
            "command": command,
            "machine": machine,
            "skipped": skipped,
            "rows": [_row_json(r) for r in results],
        }
        args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    if args.markdown is not None:
        body = markdown(results, skipped, command, date, machine)
        write_section(args.markdown, SECTION, body)
    return 0


def _row_json(r: RowResult) -> dict[str, Any]:
    return {
        "name": r.row.name,
        "profile": r.row.profile,
        "trace": r.row.trace,
        "requests": r.requests,
        "metrics": {p: m.to_json() for p, m in r.metrics.items()},
        "targets": [{"target": t, "met": met, "measured": v} for t, met, v in r.targets()],
    }


def _cells(m: PolicyMetrics) -> list[str]:
    return [
        _fmt(m.both_attainment),
        f"{m.throughput_tok_s or 0:,.0f}",
        _fmt(m.ttft_attainment),
        _fmt(m.tbt_attainment),
        _fmt(m.tpot_attainment),
        f"{m.ttft_s.p99 or 0:.2f}",
        f"{1e3 * (m.tbt_s.p99 or 0):.0f}",
        f"{m.preemptions:,}",
        _fmt(m.stall_fraction, 2),
    ]


HEADER = (
    "both met",
    "tokens/s",
    "TTFT",
    "TBT",
    "TPOT",
    "TTFT p99 s",
    "TBT p99 ms",
    "preemptions",
    "stall",
)


def text_table(results: list[RowResult]) -> str:
    lines = [f"{'row':16s} {'policy':10s} " + " ".join(f"{h:>11s}" for h in HEADER)]
    for r in results:
        for policy, m in r.metrics.items():
            lines.append(
                f"{r.row.name:16s} {policy:10s} " + " ".join(f"{c:>11s}" for c in _cells(m))
            )
        for target, met, value in r.targets():
            lines.append(f"{'':16s} {'MET' if met else 'MISSED':10s} {target}: {value}")
    return "\n".join(lines)


def markdown(
    results: list[RowResult],
    skipped: list[str],
    command: str,
    date: str,
    machine: dict[str, Any],
) -> str:
    lines = [
        "## Rotation quality: FCFS, the paper's LVF and the bounded LVF",
        "",
        f"Command: `{command}` (each row replays its trace three times on identical arrivals; "
        "a simulation, so the numbers do not depend on the machine)",
        "",
        f"- Date: {date}",
        f"- Commit: {describe_commit(machine)}",
        f"- Machine: {describe(machine)}",
        "- SLOs: TTFT 5 s, TBT 100 ms. Attainments in % of requests (TBT: of token gaps). "
        '"both met" is goodput: TTFT and TPOT (request-level) both within their SLOs.',
        "",
        "| row | policy | " + " | ".join(HEADER) + " |",
        "|---|---|" + "---:|" * len(HEADER),
    ]
    for r in results:
        for policy, m in r.metrics.items():
            lines.append(f"| {r.row.name} | {policy} | " + " | ".join(_cells(m)) + " |")
    lines += ["", "| row | target | measured (lvf vs fcfs) | |", "|---|---|---|---|"]
    for r in results:
        for target, met, value in r.targets():
            lines.append(f"| {r.row.name} | {target} | {value} | {'MET' if met else 'MISSED'} |")
    lines += ["", "Rows and their traces:", ""]
    for r in results:
        knobs = r.row.knobs
        lines.append(
            f"- **{r.row.name}**: `{r.row.profile}`, {r.row.trace} ({r.requests:,} requests); "
            f"{knobs.max_batched_tokens:,} batched tokens, {knobs.max_running:,} running slots"
            + (
                f", B_xfer {knobs.rotation.transfer_budget_blocks}"
                if knobs.rotation.transfer_budget_blocks is not None
                else ""
            )
            + (f", {knobs.cpu_kv_bytes / 1e9:g} GB CPU KV" if knobs.cpu_kv_bytes else "")
        )
    if skipped:
        lines += ["", f"Skipped (trace absent): {', '.join(skipped)}."]
    return "\n".join(lines) + "\n"
