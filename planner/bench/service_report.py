"""`planner bench service` results: the JSON report, its comparison with a
baseline, the text table and the docs/benchmarks.md section."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from planner.bench.machine import describe, describe_commit
from planner.bench.service_load import PhaseConfig, PhaseResult
from planner.bench.table import markdown_table, text_table

SECTION = "service:load"
BENCH = "service"
# Phases at the iteration rate must answer every call; overload phases are
# expected to refuse some.
LOAD_PHASE = "load"


@dataclass(slots=True)
class ServiceReport:
    date: str
    command: str
    machine: dict[str, Any]
    phases: list[PhaseResult]
    baseline: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "bench": BENCH,
            "date": self.date,
            "command": self.command,
            "machine": self.machine,
            "phases": [p.to_json() for p in self.phases],
            "baseline": self.baseline,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> ServiceReport:
        if data.get("bench") != BENCH:
            raise ValueError(f"not a `planner bench service` result: bench={data.get('bench')!r}")
        return ServiceReport(
            date=str(data["date"]),
            command=str(data["command"]),
            machine=dict(data["machine"]),
            phases=[PhaseResult.from_json(p) for p in data["phases"]],
            baseline=data.get("baseline"),
        )


def _ok_ms(phase: PhaseResult, field: str) -> float | None:
    ok = phase.codes.get("OK")
    return None if ok is None else float(getattr(ok, field))


def _comparable(config: PhaseConfig) -> PhaseConfig:
    """Phases compare when everything but their length matches."""
    return replace(config, duration_s=0.0)


def compare(phases: list[PhaseResult], baseline: dict[str, Any], factor: float) -> dict[str, Any]:
    """Phases run alike in both runs (same name, clients, rate, deadline,
    server limits and snapshot; any length). A phase regressed when its OK
    p50 grew beyond factor x the old one, its throughput fell below the old
    one / factor, the load phase has errors where the old had none, or the
    call after the phase failed where it had succeeded."""
    old = {_comparable(p.config): p for p in ServiceReport.from_json(baseline).phases}
    cases = []
    for new in phases:
        before = old.get(_comparable(new.config))
        if before is None:
            continue
        reasons = []
        old_p50, new_p50 = _ok_ms(before, "p50_ms"), _ok_ms(new, "p50_ms")
        if old_p50 is not None and (new_p50 is None or new_p50 > factor * old_p50):
            reasons.append("p50")
        if new.throughput_per_s * factor < before.throughput_per_s:
            reasons.append("throughput")
        if new.config.name == LOAD_PHASE and new.errors and not before.errors:
            reasons.append("errors")
        if new.probe_after != "OK" and before.probe_after == "OK":
            reasons.append("probe")
        cases.append(
            {
                "phase": new.config.name,
                "old_p50_ms": old_p50,
                "new_p50_ms": new_p50,
                "old_throughput_per_s": before.throughput_per_s,
                "new_throughput_per_s": new.throughput_per_s,
                "old_errors": before.errors,
                "new_errors": new.errors,
                "regressed": reasons,
            }
        )
    return {
        "factor": factor,
        "baseline_date": baseline.get("date"),
        "baseline_commit": (baseline.get("machine", {}).get("git") or {}).get("commit"),
        "cases": cases,
        "regressions": sum(bool(c["regressed"]) for c in cases),
        "unmatched": len(phases) - len(cases),
    }


HEADERS = (
    "phase",
    "server limits",
    "clients x rate",
    "deadline ms",
    "calls",
    "OK/s",
    "p50 ms",
    "p99 ms",
    "p999 ms",
    "max ms",
    "not OK: calls (p50 ms)",
    "over deadline",
    "RSS MB start/mid/end",
    "call after",
)
RIGHT = {3, 4, 5, 6, 7, 8, 9, 11}


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}" if value >= 100 else f"{value:.2f}"


def _rate(phase: PhaseResult) -> str:
    c = phase.config
    return f"{c.clients} x {c.rate_hz:g} Hz" if c.rate_hz > 0 else f"{c.clients} x unpaced"


def _refusals(phase: PhaseResult) -> str:
    parts = [
        f"{code} {stats.calls:,} ({_fmt(stats.p50_ms)})"
        for code, stats in phase.codes.items()
        if code != "OK"
    ]
    return "; ".join(parts) or "none"


def _rss(phase: PhaseResult) -> str:
    return "/".join(f"{phase.rss_at(f) / 1024:.0f}" for f in (0.0, 0.5, 1.0))


def rows(report: ServiceReport) -> list[list[str]]:
    return [
        [
            p.config.name,
            p.config.limits.label,
            _rate(p),
            f"{p.config.deadline_ms:g}",
            f"{p.calls:,}",
            f"{p.throughput_per_s:,.0f}",
            _fmt(_ok_ms(p, "p50_ms")),
            _fmt(_ok_ms(p, "p99_ms")),
            _fmt(_ok_ms(p, "p999_ms")),
            _fmt(_ok_ms(p, "max_ms")),
            _refusals(p),
            f"{p.over_deadline:,}",
            _rss(p),
            p.probe_after,
        ]
        for p in report.phases
    ]


def _baseline_lines(baseline: dict[str, Any]) -> list[str]:
    lines = [
        f"Baseline {baseline.get('baseline_date')} ({str(baseline.get('baseline_commit'))[:12]}), "
        f"noise factor {baseline['factor']:g}: {baseline['regressions']} regressed"
    ]
    for c in baseline["cases"]:
        flag = ("REGRESSED: " + ", ".join(c["regressed"])) if c["regressed"] else "ok"
        lines.append(
            f"  {c['phase']}: p50 {_fmt(c['old_p50_ms'])} -> {_fmt(c['new_p50_ms'])} ms, "
            f"OK/s {c['old_throughput_per_s']:,.0f} -> {c['new_throughput_per_s']:,.0f}, "
            f"errors {c['old_errors']} -> {c['new_errors']}: {flag}"
        )
    return lines


def text_report(report: ServiceReport) -> str:
    lines = [
        f"planner bench service, {report.date}, {describe_commit(report.machine)}",
        describe(report.machine),
        "",
        text_table(HEADERS, rows(report), RIGHT),
    ]
    if report.baseline is not None:
        lines += ["", *_baseline_lines(report.baseline)]
    return "\n".join(lines)


def _load_summary(report: ServiceReport) -> str:
    load = next((p for p in report.phases if p.config.name == LOAD_PHASE), None)
    if load is None:
        return ""
    rss = [load.rss_at(f) / 1024 for f in (0.0, 0.5, 1.0)]
    return (
        f"Load: {load.config.clients} client processes for {load.window_s:.1f} s, "
        f"{load.calls:,} calls, {load.errors:,} not OK, {load.over_deadline} answered past "
        f"deadline; server RSS {rss[0]:.0f} MB at start, {rss[1]:.0f} MB in the middle, "
        f"{rss[2]:.0f} MB at the end ({len(load.rss)} samples, max "
        f"{max(s.rss_kb for s in load.rss) / 1024:.0f} MB)."
    )


def markdown_section(report: ServiceReport) -> str:
    first = report.phases[0].config if report.phases else None
    workload = (
        f"every call is PlanRotation on one seeded synthetic snapshot of {first.requests} "
        f"tracked requests (seed {first.seed}, {first.form} form; the policies bench's mix)"
        if first
        else "no phases"
    )
    return "\n".join(
        [
            "## Service under load: concurrent engines over gRPC",
            "",
            f"Command: `{report.command}`",
            "",
            f"- Date: {report.date}",
            f"- Commit: {describe_commit(report.machine)}",
            f"- Machine: {describe(report.machine)}. Other engineers' test runs shared the "
            "machine; the 64 client processes share its cores with the server, so the "
            "numbers are the server and its clients together.",
            f"- Workload: {workload}. Each client is its own process "
            "(`python -m planner.bench.service_client`) with its own channel, no retries; "
            "all connect and make one untimed call, then start together on a signal from "
            "the parent. A paced client calls once per iteration (the next iteration starts "
            "a period after the previous began, at once if the call took longer); an "
            "unpaced one calls again as soon as it is answered. Every call carries the "
            "deadline shown. The server is `planner serve --store :memory: --log-level "
            "warning` with the limits shown.",
            "- Phases: *load* paces every client at the iteration rate against a server "
            "whose concurrency limit is above the clients (gRPC frees a slot only after the "
            "response went out, so at a limit equal to the clients an engine calling again "
            "at once is sometimes refused); `--overload` then runs unpaced clients against "
            "servers with the limits shown (`planner serve --max-workers W "
            "--max-concurrent-rpcs C`), the server's defaults being 8 workers and 128 RPCs.",
            "- Columns: OK/s is OK calls per second of the phase; latencies are OK calls' "
            "(p999 of a few thousand calls is near the maximum); *not OK* counts every other "
            "status with its median latency (a refusal runs no handler, but waits for the "
            "CPU like every call here; a deadline expiry takes the deadline); "
            "*over deadline* counts calls answered more than 100 ms past their "
            "deadline (a hung call would show here); RSS is the server's VmRSS at the "
            "phase's start, middle and end; *call after* is one plain call on a fresh "
            "channel right after the phase.",
            "",
            markdown_table(HEADERS, rows(report), RIGHT),
            "",
            _load_summary(report),
            "",
            "`make bench` runs this with the other benches at full size and rewrites this "
            "page; `make bench-quick` (what CI runs, a few minutes) runs every bench small, "
            "this one with 16 clients for 5 s and two 3 s overload phases, and writes JSON "
            "under out/bench-quick/ only.",
        ]
    ).rstrip()
