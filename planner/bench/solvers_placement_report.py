"""Text and markdown of `planner bench solvers --problem placement` (from the
JSON document it writes)."""

from __future__ import annotations

from typing import Any

from planner.bench.machine import describe, describe_commit
from planner.bench.solvers_offload_report import STATUS_SHORT
from planner.bench.table import markdown_table, text_table

HEADERS = [
    "GPUs",
    "backend",
    "n",
    "models",
    "limit s",
    "wall max s",
    "objective mean GB",
    "gap to best bound max",
    "own gap max",
    "statuses (backend used)",
    "time to 1% max s",
    "time to optimal max s",
]
RIGHT = {0, 2, 4, 5, 6, 7, 8, 10, 11}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _reached(c: dict[str, Any], key: str, count: str) -> str:
    if c[key] is not None:
        return _s(c[key])
    return f"{c[count]}/{c['n']} reached"


def _statuses(e: dict[str, Any]) -> str:
    st = " ".join(
        f"{STATUS_SHORT.get(k.split(' ')[0], k)}{' fb' if 'fallback' in k else ''} {v}"
        for k, v in sorted(e["statuses"].items())
    )
    return f"{st} ({', '.join(f'{k} {v}' for k, v in sorted(e['backend_used'].items()))})"


def _rows(doc: dict[str, Any]) -> list[list[str]]:
    rows = []
    for c in doc["cases"]:
        models = c["models"]
        m = (
            f"{min(models)}-{max(models)}"
            if models and min(models) != max(models)
            else str(models[0] if models else "-")
        )
        for limit, e in c["limits"].items():
            if not e["n"]:
                continue
            rows.append(
                [
                    str(c["gpus"]),
                    c["backend"],
                    str(e["n"]),
                    m,
                    "-" if c["backend"] == "exhaustive" else limit,
                    _s(e["wall_s_max"]),
                    f"{e['objective_gb_mean']:.1f}",
                    _pct(e["gap_to_best_bound_max"]),
                    _pct(e["own_gap_max"]),
                    _statuses(e),
                    _reached(c, "time_to_1pct_s_max", "reached_1pct"),
                    _reached(c, "time_to_optimal_s_max", "proved_optimal"),
                ]
            )
            if c["backend"] == "exhaustive":
                break
    return rows


def _target_lines(doc: dict[str, Any]) -> list[str]:
    lines = []
    for t in doc["targets"]:
        if t["status"] == "NOT RUN":
            lines.append(f"- {t['target']}: NOT RUN ({t['detail']})")
            continue
        detail = f"; {t['detail']}" if t["detail"] else ""
        lines.append(
            f"- {t['target']}: **{t['status']}** (worst gap to the best bound "
            f"{_pct(t['gap'])} at {t['limit_s']:g} s, {t['backend']}, wall max "
            f"{_s(t['wall_s_max'])} s{detail})"
        )
    return lines


def _fallback_lines(doc: dict[str, Any]) -> list[str]:
    lines = [f"- {b} skipped: {why}" for b, why in doc["skipped"].items()]
    for c in doc["cases"]:
        if c["backend"] != "gurobi":
            continue
        runs = [r for row in c["instances"] for r in row["runs"]]
        notes = {r["note"].split(" (")[0] for r in runs if r["backend_used"] != "gurobi"}
        for n in sorted(notes):
            lines.append(f"- gurobi at {c['gpus']} GPUs fell back to CP-SAT: {n}")
        if any(r["fallback"] and r["backend_used"] == "gurobi" for r in runs):
            lines.append(
                f"- gurobi at {c['gpus']} GPUs: no solver called (the placer answered its "
                "warm start: too little time left to set the model up)"
            )
    return lines


def _baseline_lines(doc: dict[str, Any]) -> list[str]:
    b = doc.get("baseline")
    if not b:
        return []
    return [
        f"Against the baseline of {b['baseline_date']} ({b['baseline_commit']}): "
        f"{len(b['cases'])} comparisons, {b['regressions']} regressions."
    ]


def text_report(doc: dict[str, Any]) -> str:
    parts = [
        f"planner bench solvers --problem placement: {describe(doc['machine'])}",
        f"command: {doc['command']}",
        "",
        text_table(HEADERS, _rows(doc), RIGHT),
        "",
        "targets:",
        *_target_lines(doc),
        *_fallback_lines(doc),
        *_baseline_lines(doc),
        f"wall {doc['wall_s']:.0f} s",
    ]
    return "\n".join(parts)


def markdown_section(doc: dict[str, Any]) -> str:
    parts = [
        "## Solvers: AQUA's placer (model-to-server placement)",
        "",
        f"`{doc['command']}` — {doc['date']}, {describe(doc['machine'])}, "
        f"{describe_commit(doc['machine'])}; {doc['wall_s']:.0f} s.",
        "",
        "Seeded clusters of 8-GPU servers (80 GB GPUs) ~90% filled with 1/2/4-shard models, "
        "producers and consumers of 2-40 GB, one instance per mix (balanced, producer-heavy, "
        "consumer-heavy). Each call is `place_models` (warm start + model + solve within the "
        "limit). *Gap to best bound*: (objective - the best bound any run found for the "
        "instance, at least the trivial mean bound) / objective; *own gap*: the solver's. "
        "Time to 1%: a solve with relative_gap 0.01, run where a limit run reached it; "
        "time to optimal: the first limit run that proved it.",
        "",
        "### Targets",
        "",
        *_target_lines(doc),
        *_fallback_lines(doc),
        "",
        "### Results",
        "",
        markdown_table(HEADERS, _rows(doc), RIGHT),
        "",
        *_baseline_lines(doc),
        "Details (per instance, every run): docs/bench/solvers_placement.json; "
        "measurements before and after the placer's changes: docs/placement.md.",
    ]
    return "\n".join(parts)
