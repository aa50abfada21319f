"""Text and markdown of `planner bench solvers --problem offload` (from the
JSON document it writes)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from planner.bench.machine import describe, describe_commit
from planner.bench.solvers_offload_instances import PRESSURES
from planner.bench.table import markdown_table, text_table

STATUS_SHORT = {
    "OPTIMAL": "opt",
    "FEASIBLE": "feas",
    "INFEASIBLE": "infeas",
    "TIMEOUT_NO_SOLUTION": "none",
    "TOO_LARGE": "too large",
    "ERROR": "error",
    "MODEL_INVALID": "invalid",
}
ANOMALIES_SHOWN = 12


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}%"


def _statuses(counts: dict[str, int]) -> str:
    order = list(STATUS_SHORT)
    items = sorted(counts.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99)
    return " ".join(f"{STATUS_SHORT.get(k, k)} {v}" for k, v in items)


def _limit(case: dict[str, Any]) -> str:
    if case.get("node_limit") is not None:
        return f"{case['node_limit']:,} nodes"
    return "-" if case["time_limit_ms"] is None else f"{case['time_limit_ms']:g}"


def _nodes(case: dict[str, Any]) -> str:
    if case.get("nodes_max") is None:
        return "-"
    return f"{case['nodes_p50']:.0f} / {case['nodes_max']}"


def _fraction(num: int, den: int) -> str:
    return "-" if den == 0 else f"{num}/{den} ({num / den:.0%})"


MAIN_HEADERS = [
    "size",
    "backend",
    "n",
    "limit",
    "p50 ms",
    "p99 ms",
    "max ms",
    "cpu p99 ms",
    "nodes p50 / max",
    "over limit",
    "statuses",
    "gap p50",
    "gap max",
    "= exhaustive",
    "= best",
    "excess latency max",
]
MAIN_RIGHT = {2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 15}


def _main_rows(doc: dict[str, Any]) -> list[list[str]]:
    rows = []
    for c in doc["cases"]:
        vb = c["vs_best"]
        excess = vb["excess_stall_pct_of_step_max"]
        excess_text = _pct(excess)
        if vb["no_plan"]:
            excess_text += f" ({vb['no_plan']} no plan)"
        rows.append(
            [
                f"{c['requests']}x{c['layers']}",
                c["backend"],
                str(c["n"]),
                _limit(c),
                _ms(c["p50_ms"]),
                _ms(c["p99_ms"]),
                _ms(c["max_ms"]),
                _ms(c.get("cpu_p99_ms")),
                _nodes(c),
                "-" if c["time_limit_ms"] is None else str(c["over_limit"]),
                _statuses(c["statuses"]),
                _pct(None if c["gap_p50"] is None else 100 * c["gap_p50"]),
                _pct(None if c["gap_max"] is None else 100 * c["gap_max"]),
                _fraction(c["vs_exhaustive"]["identical"], c["vs_exhaustive"]["compared"]),
                _fraction(vb["best"], vb["compared"]),
                excess_text,
            ]
        )
    return rows


CLASS_HEADERS = [
    "size",
    "backend",
    *(f"{p}: p50 / p99 ms [cpu p99] (statuses)" for p in PRESSURES),
]


def _class_rows(doc: dict[str, Any]) -> list[list[str]]:
    rows = []
    for c in doc["cases"]:
        cells = []
        for p in PRESSURES:
            b = c["by_pressure"][p]
            if not b["n"]:
                cells.append("-")
                continue
            cpu = "" if b.get("cpu_p99_ms") is None else f" [{_ms(b['cpu_p99_ms'])}]"
            cells.append(
                f"{_ms(b['p50_ms'])} / {_ms(b['p99_ms'])}{cpu} ({_statuses(b['statuses'])})"
            )
        rows.append([f"{c['requests']}x{c['layers']}", c["backend"], *cells])
    return rows


PRUNING_HEADERS = [
    "size",
    "patterns pruned / periodic",
    "compared",
    "periodic proved optimal",
    "identical objective",
    "excess latency mean",
    "excess latency max",
    "periodic bnb p50 / max ms",
]


def _pruning_rows(doc: dict[str, Any]) -> list[list[str]]:
    return [
        [
            f"{p['requests']}x{p['layers']}",
            f"{p['pruned_choices']} / {p['periodic_choices']}",
            str(p["compared"]),
            str(p["periodic_proved_optimal"]),
            _fraction(p["identical"], p["periodic_proved_optimal"]),
            _pct(p["excess_stall_pct_of_step_mean"]),
            _pct(p["excess_stall_pct_of_step_max"]),
            f"{_ms(p['periodic_bnb_p50_ms'])} / {_ms(p['periodic_bnb_max_ms'])}",
        ]
        for p in doc["pruning"]
    ]


def _target_lines(doc: dict[str, Any]) -> list[str]:
    lines = []
    for t in doc["targets"]:
        within = (
            "always within the time limit"
            if t["within_time_limit"]
            else ("NOT always within the time limit")
        )
        if t.get("p99_on") == "cpu":
            within = "stopped on work"
        excess = "-" if t["excess_max_pct"] is None else f"{t['excess_max_pct']:.2f}%"
        if t["no_plan"]:
            excess += f", {t['no_plan']} without a plan"
        cpu = t.get("worst_class_cpu_p99_ms")
        on_cpu = t.get("p99_on") == "cpu"
        cpu_text = "" if cpu is None or on_cpu else f"; CPU time p99 there {_ms(cpu)} ms"
        what = "CPU time p99" if on_cpu else "p99"
        limit = t["p99_limit_ms"]
        latency_target = (
            "no latency target"
            if limit is None
            else f"target <= {limit:g} ms in every class: {t['p99_status'].upper()}"
        )
        lines.append(
            f"{t['size']} {t['backend']}: {what} {_ms(t['p99_ms'])} ms (worst class "
            f"{t['worst_class']}: {_ms(t['worst_class_p99_ms'])} ms{cpu_text}), "
            f"{latency_target}; plan within "
            f"{t['quality_limit_pct']:g}% of the best known: worst {excess}: "
            f"{t['quality_status'].upper()}; {within}"
        )
    if not lines:
        lines.append("targets not measured (sizes 4x32, 16x32 and 64x80 not run)")
    return lines


def _anomaly_lines(doc: dict[str, Any]) -> list[str]:
    """Contradictions between backends (bugs) in full up to a few, then the
    worst time-limit overrun of each backend at each size."""
    anomalies = doc["anomalies"]
    bugs = [a for a in anomalies if a["kind"] != "time limit"]
    overruns = [a for a in anomalies if a["kind"] == "time limit"]
    lines = []
    if not bugs:
        lines.append(
            "contradictions between backends: none (no two proved optima differ, no proof of "
            "infeasibility next to a plan, no bound past another backend's plan)"
        )
    else:
        kinds = Counter(a["kind"] for a in bugs)
        lines.append(
            "contradictions between backends: "
            + ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items()))
        )
        for a in bugs[:ANOMALIES_SHOWN]:
            lines.append(
                f"{a['size']} #{a['instance']} ({a['pressure']}, seed {a['seed']}): "
                f"{a['kind']}: {a['detail']}"
            )
        if len(bugs) > ANOMALIES_SHOWN:
            lines.append(f"... {len(bugs) - ANOMALIES_SHOWN} more in the JSON")
    if not overruns:
        lines.append("calls over the time limit: none")
        return lines
    lines.append(
        f"calls over the time limit + slack: {len(overruns)}; the worst per size and backend:"
    )
    worst: dict[tuple[str, str], dict[str, Any]] = {}
    for a in overruns:
        key = (a["size"], a["detail"].split(" ", 1)[0])
        if key not in worst or a["wall_ms"] > worst[key]["wall_ms"]:
            worst[key] = a
    for a in worst.values():
        lines.append(
            f"{a['size']} #{a['instance']} ({a['pressure']}, seed {a['seed']}): {a['detail']}"
        )
    return lines


def _load_text(doc: dict[str, Any]) -> str:
    load = doc.get("load_avg_1m_by_size") or []
    if not load:
        return ""
    return f"; 1-min load average before each size: {', '.join(f'{v:g}' for v in load)}"


def _node_limits(doc: dict[str, Any]) -> str:
    limits = doc["config"].get("node_limits") or {}
    return ", ".join(f"{k} {v:,} nodes" for k, v in limits.items())


def _limits(doc: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:g} ms" for k, v in doc["config"]["time_limits_ms"].items())


def text_report(doc: dict[str, Any]) -> str:
    parts = [
        f"{doc['bench']}: {doc['config']['instances_per_size']} instances per size, "
        f"time limits {_limits(doc)} (+{doc['config']['slack_ms']:g} "
        f"ms slack), seed {doc['config']['seed']}; {doc['wall_s']:.0f} s",
        "",
        text_table(MAIN_HEADERS, _main_rows(doc), MAIN_RIGHT),
        "",
        "by pressure class",
        text_table(CLASS_HEADERS, _class_rows(doc), set()),
    ]
    if doc["pruning"]:
        parts += [
            "",
            "pruned vs periodic search space (bnb)",
            text_table(PRUNING_HEADERS, _pruning_rows(doc), {2, 3, 5, 6}),
        ]
    parts += ["", "targets:", *(f"  {t}" for t in _target_lines(doc))]
    for backend, why in doc["skipped"].items():
        parts.append(f"skipped {backend}: {why}")
    parts += ["", "anomalies:", *(f"  {a}" for a in _anomaly_lines(doc))]
    if doc.get("baseline"):
        b = doc["baseline"]
        parts += [
            "",
            f"baseline ({b['baseline_date']}): {b['regressions']} regression(s) beyond "
            f"{b['factor']:g}x p50, {len(b['cases'])} cases compared",
        ]
        for c in b["cases"]:
            flag = "  REGRESSED" if c["regressed"] else ""
            parts.append(
                f"  {c['size']} {c['backend']}: p50 {_ms(c['old_p50_ms'])} -> "
                f"{_ms(c['new_p50_ms'])} ms ({c['p50_ratio']:.2f}x){flag}"
            )
    return "\n".join(parts)


def markdown_section(doc: dict[str, Any]) -> str:
    cfg = doc["config"]
    machine = doc["machine"]
    settings = "; ".join(f"{layers} layers: {text}" for layers, text in doc["settings"].items())
    lines = [
        "## Solvers: the layer-offload ILP",
        "",
        f"Command: `{doc['command']}`",
        "",
        f"- Date: {doc['date']}; the run took {doc['wall_s']:.0f} s",
        f"- Commit: {describe_commit(machine)}",
        f"- Machine: {describe(machine)}{_load_text(doc)}",
        f"- Instances: {cfg['instances_per_size']} seeded synthetic long-context decode batches "
        "per size (REQUESTSxLAYERS), requests of 8k-128k tokens (log-uniform), 16-token "
        "blocks, TBT SLO 1.2-2x the step's compute, window options 1-64 steps, the pruned "
        f"search space; profiles: {settings}. An equal share of each memory pressure class: "
        "*fits* (the budget holds the whole KV), *moderate* (30-80% of the way from the least "
        "feasible budget to the whole KV), *tight* (within 5% of the least feasible budget: "
        "barely feasible) and *infeasible* (0.5-5% below it; memory or SLO). "
        "`planner/bench/solvers_offload_instances.py` has the details.",
        f"- Backends: `bnb` (the planner's search on the exact step latency, `search.py`: "
        "starts, compiled local search with stagger moves, a second descent from a spread start "
        "when the link idles, and kicks (spread kicks among them), compiled-bound branch and "
        "bound on small trees), `cp-sat` "
        "and `gurobi` (the ILP of `ilp.py` through `planner.solvers`, one thread), each with "
        f"the greedy plan as warm start and a time limit per size ({_limits(doc)}); "
        f"`bnb-work` the same search stopped on work alone ({_node_limits(doc)}: about what "
        "one core does within the time limit), whose plans are the same on any machine, its "
        "latency judged on CPU time; `bnb-work-nospread` the same without the spread start's "
        "descent and spread kicks, `bnb-work-narrow` without them nor the stagger moves; "
        f"`bnb-long` the same search with {cfg['reference_time_limit_s']:g} s, the reference "
        "where enumeration is out of reach; "
        "`exhaustive` (every assignment in closed form, no limit) where there are at most "
        f"{cfg['max_enumeration']:,}. Times are wall times of the solve call alone (the model "
        "is built before), after an untimed warm-up; *cpu*: this process's CPU time in the "
        "call (on a loaded machine wall time runs ahead of it while the process waits for a "
        "core); *nodes*: assignments simulated plus tree nodes bounded (the work limit's "
        f"unit); *over limit*: calls over the limit + {cfg['slack_ms']:g} ms.",
        "- Quality: *= exhaustive*, the plans whose objective equals the exhaustive optimum; "
        "*= best*, those equal to the best plan any backend found on the instance; *excess "
        "latency*, a plan's exact step latency beyond the best plan's, in % of the best plan's "
        "(no plan: a backend returned none where another found one). Every plan is scored on "
        "the exact event model; CP-SAT and Gurobi optimise the ILP's linear surrogate, so "
        "only their plans are compared (their bounds are not on the exact latency). *gap*: "
        "(objective - bound) / objective at return, on the exact step latency (bnb's bound is "
        "the relaxed-link bound of `step_kernels.py`, the root's on large trees).",
    ]
    for backend, why in doc["skipped"].items():
        lines.append(f"- Skipped `{backend}`: {why}")
    lines += [
        "",
        markdown_table(MAIN_HEADERS, _main_rows(doc), MAIN_RIGHT),
        "",
        "Solve time by memory pressure class:",
        "",
        markdown_table(CLASS_HEADERS, _class_rows(doc), set()),
        "",
        "Targets: p99 <= 5 ms at 16 requests x 32 layers and <= 20 ms at 64 x 80 in every "
        "pressure class, the plan within 1% of the best known (step latency; at 4 x 32 the "
        "exhaustive optimum); `bnb` on wall time, `bnb-work` on CPU time:",
        "",
        *(f"- {t}" for t in _target_lines(doc)),
    ]
    if doc["pruning"]:
        p0 = doc["pruning"][0]
        lines += [
            "",
            "What pruning costs: the pruned space's optimum (bnb, proved) against the periodic "
            "space's (every distance with every phase, plus evenly spread counts; bnb from the "
            f"pruned plan, {p0['time_limit_s']:g} s limit), on the feasible instances; the "
            "excess is the pruned plan's extra stall in % of the periodic plan's step latency.",
            "",
            markdown_table(PRUNING_HEADERS, _pruning_rows(doc), {2, 3, 5, 6}),
        ]
    lines += ["", "Anomalies (contradictions between backends, calls over the time limit):", ""]
    lines += [f"- {a}" for a in _anomaly_lines(doc)]
    return "\n".join(lines) + "\n"
