"""The cluster comparison (planner.replay.cluster_engine): a table with
policies as columns and the replay JSON with a ``cluster`` block per policy.

Latency definitions are the rotation replay's (planner.replay.metrics): TBT
is every gap between two tokens; TPOT is a finished request's mean decode
time, which is what the KunServe paper calls TBT. An SLO violation is a
request that misses its TTFT SLO or its TPOT SLO (or never finishes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from planner.replay.cluster_engine import ClusterRun, ClusterStats
from planner.replay.console import print_table
from planner.replay.metrics import PolicyMetrics, summarize
from planner.replay.report import DASH, fmt_pct, fmt_seconds, goodput_rows, to_json

TOPOLOGY = "cluster"


@dataclass(frozen=True, slots=True)
class ClusterMetrics:
    metrics: PolicyMetrics
    stats: ClusterStats

    @property
    def policy(self) -> str:
        return self.metrics.policy

    @property
    def slo_violations(self) -> float | None:
        a = self.metrics.both_attainment
        return None if a is None else 1.0 - a

    def cluster_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self.stats)
        data["slo_violations"] = self.slo_violations
        return data


def summarize_cluster(run: ClusterRun) -> ClusterMetrics:
    return ClusterMetrics(summarize(run.result), run.stats)


def _int(value: float | None) -> str:
    return DASH if value is None else f"{value:,.0f}"


def _gb(value: float | None) -> str:
    return DASH if value is None else f"{value / 1e9:,.1f} GB"


Row = tuple[str, Callable[[ClusterMetrics], float | None], Callable[[float | None], str]]


def _m(
    f: Callable[[PolicyMetrics], float | None],
) -> Callable[[ClusterMetrics], float | None]:
    return lambda x: f(x.metrics)


def rows() -> list[Row]:
    m = _m
    goodput = [(row.label, m(row.get), row.fmt) for row in goodput_rows()]
    return [
        *goodput,
        ("TTFT p50", m(lambda p: p.ttft_s.p50), fmt_seconds),
        ("TTFT p99", m(lambda p: p.ttft_s.p99), fmt_seconds),
        ("TBT p50 (token gaps)", m(lambda p: p.tbt_s.p50), fmt_seconds),
        ("TBT p99 (token gaps)", m(lambda p: p.tbt_s.p99), fmt_seconds),
        ("TPOT p50 (paper's TBT)", m(lambda p: p.tpot_s.p50), fmt_seconds),
        ("TPOT p99 (paper's TBT)", m(lambda p: p.tpot_s.p99), fmt_seconds),
        ("TTFT attainment", m(lambda p: p.ttft_attainment), fmt_pct),
        ("TPOT attainment", m(lambda p: p.tpot_attainment), fmt_pct),
        ("SLO violations", lambda x: x.slo_violations, fmt_pct),
        ("Finished", m(lambda p: p.finished), _int),
        ("Rejected (never fits)", lambda x: x.stats.rejected, _int),
        ("Drops (groups formed)", lambda x: x.stats.groups_formed, _int),
        ("Restores", lambda x: x.stats.restores, _int),
        ("Largest group", lambda x: x.stats.max_merged_instances or None, _int),
        ("Grouped instance-seconds", lambda x: x.stats.grouped_instance_s, _int),
        ("KV exchanged", lambda x: x.stats.exchange_bytes, _gb),
        ("Parameters reloaded", lambda x: x.stats.reload_bytes, _gb),
        ("KV migrations", lambda x: x.stats.migrations, _int),
        ("KV migrated", lambda x: x.stats.migrated_bytes, _gb),
        ("Queued requests moved", lambda x: x.stats.queue_moves, _int),
        ("Preemptions (recompute)", lambda x: x.stats.preemptions, _int),
        ("Over-capacity checks (bug if > 0)", lambda x: x.stats.over_capacity, _int),
    ]


def cluster_table(
    metrics: Sequence[ClusterMetrics], *, title: str | None = None, caption: str | None = None
) -> Table:
    table = Table(
        title=title or "Cluster replay", caption=caption, header_style="bold", title_style="bold"
    )
    table.add_column("Metric", no_wrap=True)
    for x in metrics:
        table.add_column(x.policy, justify="right", no_wrap=True)
    for label, get, fmt in rows():
        table.add_row(Text(label), *(Text(fmt(get(x))) for x in metrics))
    return table


def markdown_table(metrics: Sequence[ClusterMetrics]) -> str:
    """The same rows as a markdown table (for docs/replay.md)."""
    head = "| Metric | " + " | ".join(x.policy for x in metrics) + " |"
    rule = "|---|" + "---:|" * len(metrics)
    body = [
        f"| {label} | " + " | ".join(fmt(get(x)) for x in metrics) + " |"
        for label, get, fmt in rows()
    ]
    return "\n".join([head, rule, *body])


def print_cluster_report(
    metrics: Sequence[ClusterMetrics],
    *,
    console: Console | None = None,
    title: str | None = None,
    caption: str | None = None,
) -> None:
    print_table(cluster_table(metrics, title=title, caption=caption), console)


def cluster_json(runs: Sequence[ClusterRun], metrics: Sequence[ClusterMetrics]) -> dict[str, Any]:
    """The replay JSON (planner.replay.report.to_json) plus ``topology`` and
    per policy ``cluster``."""
    data = to_json([r.result for r in runs], [m.metrics for m in metrics])
    data["topology"] = TOPOLOGY
    for entry, m in zip(data["policies"], metrics, strict=True):
        entry["cluster"] = m.cluster_json()
    return data
