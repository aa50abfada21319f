"""The serverless comparison: a table with policies as columns (the rotation
table's conventions) and the replay JSON with a ``serverless`` block per
policy. TTFT/TPOT attainment and percentiles are planner.replay.metrics';
this adds model switches and their latency (decision to slice ready), the
C2C link utilization and the mean rho."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from planner.replay.console import print_table
from planner.replay.metric_table import MetricRow, add_sections
from planner.replay.metrics import Distribution, PolicyMetrics, summarize
from planner.replay.report import DASH, fmt_pct, fmt_seconds, to_json
from planner.replay.serverless_engine import ServerlessRun, ServerlessStats

TOPOLOGY = "serverless"


@dataclass(frozen=True, slots=True)
class ServerlessMetrics:
    metrics: PolicyMetrics
    stats: ServerlessStats
    switch_s: Distribution

    @property
    def policy(self) -> str:
        return self.metrics.policy

    def serverless_json(self) -> dict[str, Any]:
        s = self.stats
        return {
            "models": s.models,
            "switches": s.switches,
            "switch_latency_s": self.switch_s.to_json(),
            "c2c_bytes": s.c2c_bytes,
            "load_bytes": s.load_bytes,
            "link_gbps": s.link_gbps,
            "link_utilization": s.link_utilization,
            "iterations": s.iterations,
            "replans": s.replans,
            "queued_on_arrival": s.queued,
            "mean_rho": s.mean_rho,
        }


def summarize_serverless(run: ServerlessRun) -> ServerlessMetrics:
    return ServerlessMetrics(
        metrics=summarize(run.result),
        stats=run.stats,
        switch_s=Distribution.of(np.array(run.stats.switch_latency_s, dtype=np.float64)),
    )


def _int(value: float | None) -> str:
    return DASH if value is None else f"{value:,.0f}"


def _num(value: float | None) -> str:
    return DASH if value is None else f"{value:.2f}"


_Row = MetricRow[ServerlessMetrics]


def _rows() -> list[tuple[str, list[_Row]]]:
    return [
        (
            "SLO attainment",
            [
                _Row("TTFT", lambda m: m.metrics.ttft_attainment, fmt_pct, 1),
                _Row("TPOT (request-level)", lambda m: m.metrics.tpot_attainment, fmt_pct, 1),
                _Row("Both", lambda m: m.metrics.both_attainment, fmt_pct, 1),
            ],
        ),
        (
            "Latency",
            [
                _Row("TTFT p50", lambda m: m.metrics.ttft_s.p50, fmt_seconds, -1),
                _Row("TTFT p99", lambda m: m.metrics.ttft_s.p99, fmt_seconds, -1),
                _Row("TPOT p50", lambda m: m.metrics.tpot_s.p50, fmt_seconds, -1),
                _Row("TPOT p99", lambda m: m.metrics.tpot_s.p99, fmt_seconds, -1),
            ],
        ),
        (
            "Model switches",
            [
                _Row("Switches", lambda m: m.stats.switches, _int),
                _Row("Switch latency p50", lambda m: m.switch_s.p50, fmt_seconds, -1),
                _Row("Switch latency p99", lambda m: m.switch_s.p99, fmt_seconds, -1),
            ],
        ),
        (
            "Link and knobs",
            [
                _Row("C2C link utilization", lambda m: m.stats.link_utilization, fmt_pct),
                _Row("Mean rho", lambda m: m.stats.mean_rho, _num),
                _Row("Finished", lambda m: m.metrics.finished, _int, 1),
                _Row("Unfinished", lambda m: m.metrics.unfinished, _int, -1),
            ],
        ),
    ]


def serverless_table(metrics: Sequence[ServerlessMetrics], title: str, caption: str) -> Table:
    table = Table(title=title, caption=caption)
    table.add_column("Metric")
    for m in metrics:
        table.add_column(m.policy, justify="right")
    return add_sections(table, _rows(), metrics)


def print_serverless_report(
    metrics: Sequence[ServerlessMetrics],
    *,
    title: str,
    caption: str,
    console: Console | None = None,
) -> None:
    print_table(serverless_table(metrics, title, caption), console)


def serverless_json(
    runs: Sequence[ServerlessRun], metrics: Sequence[ServerlessMetrics]
) -> dict[str, Any]:
    data = to_json([r.result for r in runs], [m.metrics for m in metrics])
    data["topology"] = TOPOLOGY
    for entry, m in zip(data["policies"], metrics, strict=True):
        entry["serverless"] = m.serverless_json()
    return data
