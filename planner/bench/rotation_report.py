"""The rotation bench's report: a text table for the terminal and its
section of docs/benchmarks.md."""

from __future__ import annotations

from typing import Any

from planner.bench.machine import describe, describe_commit
from planner.bench.results import PATH_LABELS, Report
from planner.bench.table import markdown_table, text_table
from planner.bench.targets import PAPER_SCHEDULING_MS

SECTION = "policies:rotation"
TITLE = "Rotation policy (Largest-VLT-First + DuplexKV): decision latency"
RESULT_HEADERS = (
    "level",
    "requests",
    "path",
    "calls",
    "p50 ms",
    "p99 ms",
    "mean ms",
    "max ms",
    "decision",
)
RESULT_RIGHT = {1, 3, 4, 5, 6, 7}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def result_rows(report: Report) -> list[list[str]]:
    return [
        [
            r.level,
            f"{r.requests:,}",
            r.label,
            f"{r.stats.calls:,}",
            _ms(r.stats.p50_ms),
            _ms(r.stats.p99_ms),
            _ms(r.stats.mean_ms),
            _ms(r.stats.max_ms),
            r.plan.describe(),
        ]
        for r in report.results
    ]


def _target_rows(report: Report) -> list[list[str]]:
    rows = [
        [t["name"], f"<= {t['p99_limit_ms']:g}", _ms(t["p99_ms"]), t["status"].upper()]
        for t in report.targets
    ]
    rows.append(
        [
            "for scale: SuperInfer's whole scheduler step (paper, mean per iteration)",
            "-",
            f"{PAPER_SCHEDULING_MS} (mean)",
            "reference",
        ]
    )
    return rows


def _for_scale(report: Report) -> str:
    ours = report.reference.get("ours", {})
    parts = []
    for path, label in (("policy", "plan_rotation"), ("grpc", "gRPC with columns")):
        for n in (1000, 10_000):
            mean = ours.get(f"{path}_{n}_mean_ms")
            if mean is not None:
                parts.append(
                    f"{label} at {n:,}: {mean:.3f} ms "
                    f"({100 * mean / PAPER_SCHEDULING_MS:.1f}% of {PAPER_SCHEDULING_MS} ms)"
                )
    return "; ".join(parts) if parts else "no counts-level case at 1,000 or 10,000 was measured"


def _floor(report: Report) -> str | None:
    f = report.grpc_floor
    if f is None:
        return None
    return (
        f"gRPC floor on this machine (GetPlannerInfo round trip, {f.calls:,} calls): "
        f"p50 {f.p50_ms:.3f} ms, p99 {f.p99_ms:.3f} ms, mean {f.mean_ms:.3f} ms; "
        "every gRPC row pays this before any planning"
    )


def _baseline_rows(baseline: dict[str, Any]) -> list[list[str]]:
    return [
        [
            c["level"],
            f"{c['requests']:,}",
            PATH_LABELS.get((c["path"], c["form"]), f"{c['path']}, {c['form']}"),
            _ms(c["old_p50_ms"]),
            _ms(c["new_p50_ms"]),
            f"{c['p50_ratio']:.2f}x",
            _ms(c["old_p99_ms"]),
            _ms(c["new_p99_ms"]),
            "REGRESSED" if c["regressed"] else "ok",
        ]
        for c in baseline["cases"]
    ]


BASELINE_HEADERS = (
    "level",
    "requests",
    "path",
    "old p50",
    "new p50",
    "ratio",
    "old p99",
    "new p99",
    "verdict",
)


def _baseline_head(baseline: dict[str, Any]) -> str:
    commit = baseline.get("baseline_commit") or "unknown commit"
    return (
        f"Against baseline of {baseline.get('baseline_date')} ({str(commit)[:12]}, "
        f"{baseline.get('baseline_cpu')}): {baseline['regressions']} regression(s), "
        f"p50 > {baseline['factor']:g}x baseline"
    )


def text_report(report: Report) -> str:
    lines = [
        TITLE,
        f"machine: {describe(report.machine)}",
        f"commit: {describe_commit(report.machine)}; seed {report.config['seed']}",
        "",
        text_table(RESULT_HEADERS, result_rows(report), RESULT_RIGHT),
        "",
        "targets (p99, ms):",
        text_table(("target", "limit", "measured", "status"), _target_rows(report), {1, 2}),
        f"ours for scale: {_for_scale(report)}",
    ]
    floor = _floor(report)
    if floor is not None:
        lines.append(floor)
    if report.baseline is not None:
        lines += [
            "",
            _baseline_head(report.baseline),
            text_table(BASELINE_HEADERS, _baseline_rows(report.baseline), {1, 3, 4, 5, 6, 7}),
        ]
    return "\n".join(lines)


def _workload(config: dict[str, Any]) -> str:
    w = config["workload"]
    rotary = 1.0 - w["running_fraction"] - w["waiting_fraction"]
    return (
        f"seeded synthetic snapshots (seed {config['seed']}): {w['running_fraction']:.0%} "
        f"RUNNING, {w['waiting_fraction']:.0%} WAITING, {rotary:.0%} ROTARY; free GPU blocks "
        f"= {w['free_fraction']:.0%} of what WAITING and ROTARY requests need (contention, so "
        f"Largest-VLT-First runs, not the FCFS fallback); B_xfer {w['transfer_budget_blocks']} "
        f"blocks; prompts log-normal (median {w['prompt_median_tokens']:g} tokens); timestamps "
        f"over the last {w['horizon_s']:g} s; {w['custom_slo_fraction']:.0%} of requests carry "
        f"their own SLO; model {w['model_name']}, {w['block_size_tokens']}-token blocks. "
        f"Block level: every block id given, pools fragmented in runs of "
        f"{w['fragment_blocks']} ids."
    )


def markdown_section(report: Report) -> str:
    calls = ", ".join(f"{int(n):,}: {c:,}" for n, c in report.config["calls"].items())
    budget = report.config.get("case_budget_s")
    parts = [
        f"## {TITLE}",
        "",
        f"Command: `{report.command}`",
        "",
        f"- Date: {report.date}",
        f"- Commit: {describe_commit(report.machine)}",
        f"- Machine: {describe(report.machine)}",
        f"- Workload: {_workload(report.config)}",
        "- Paths: *plan_rotation* times `plan_rotation(snapshot, inputs)` on a prebuilt domain "
        "snapshot; *in-process RPC* times proto request → `planner.service.methods.handle` → "
        "proto response (validation and conversion included, no serialization); *gRPC* times "
        "`PlannerClient.plan_rotation` against a `planner serve --port 0` subprocess on "
        "loopback (serialization, transport and the server's thread pool included; client "
        "and server share this machine's cores). *columns* and *rows* are the contract's two "
        "encodings of the requests (`Snapshot.columns`, `Snapshot.requests`); block-level "
        "snapshots are rows only.",
        f"- Timing: `time.perf_counter_ns` per call; timed calls per size ({calls}) after "
        "a tenth as many warm-up calls"
        + (
            f"; a case that would take over {budget:g} s gets fewer (never under 200; the "
            "calls column says how many)"
            if budget
            else ""
        )
        + "; garbage collector on, collected before each case. p99 interpolates between "
        "order statistics, so with 200 calls it sits between the two slowest. Client, "
        "server and anything else running share the cores: see the load average above.",
        "",
        "### Targets (p99, ms)",
        "",
        markdown_table(("target", "limit", "measured", "status"), _target_rows(report), {1, 2}),
        "",
        f"Ours for scale (mean): {_for_scale(report)}.",
        "",
        "### Results",
        "",
        markdown_table(RESULT_HEADERS, result_rows(report), RESULT_RIGHT),
    ]
    floor = _floor(report)
    if floor is not None:
        parts += ["", f"The {floor}."]
    if report.baseline is not None:
        parts += [
            "",
            "### Against the baseline",
            "",
            _baseline_head(report.baseline) + ".",
            "",
            markdown_table(BASELINE_HEADERS, _baseline_rows(report.baseline), {1, 3, 4, 5, 6, 7}),
        ]
    return "\n".join(parts)
