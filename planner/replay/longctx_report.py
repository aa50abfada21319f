"""The long-context offload comparison: a table with policies as columns
(the rotation table's conventions, planner.replay.report) and the replay
JSON with an ``offload`` block per policy.

TBT and TPOT attainment, throughput and the p50/p99 latencies are the
rotation replay's definitions (planner.replay.metrics: a TBT sample is a gap
between two user-visible tokens, TPOT is per finished request); this adds
P95 of TBT and TPOT, the number of re-plans (and why), Pause-Resume pauses,
requests rejected on arrival, the planning wall time as a share of the run's
wall time, and the GPU KV use.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from planner.replay.console import print_table
from planner.replay.longctx_engine import LongctxRun, LongctxStats
from planner.replay.metric_table import MetricRow, add_sections, lift_rows
from planner.replay.metrics import PolicyMetrics, latency_samples, summarize
from planner.replay.report import (
    fmt_count,
    fmt_pct,
    fmt_seconds,
    leading_sections,
    percentile_rows,
    to_json,
)
from planner.solvers import Status

TOPOLOGY = "long-context"


@dataclass(frozen=True, slots=True)
class LongctxMetrics:
    metrics: PolicyMetrics
    tbt_p95_s: float | None
    tpot_p95_s: float | None
    stats: LongctxStats

    @property
    def policy(self) -> str:
        return self.metrics.policy

    def offload_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self.stats)
        data["tbt_p95_s"] = self.tbt_p95_s
        data["tpot_p95_s"] = self.tpot_p95_s
        sim = self.metrics.simulated_s
        data["plan_wall_per_simulated_s"] = self.stats.plan_wall_s / sim if sim else None
        return data


def _p95(samples: np.ndarray[Any, np.dtype[np.float64]]) -> float | None:
    return float(np.percentile(samples, 95.0)) if samples.size else None


def summarize_longctx(run: LongctxRun) -> LongctxMetrics:
    s = latency_samples(run.result.requests)
    return LongctxMetrics(
        metrics=summarize(run.result),
        tbt_p95_s=_p95(s.tbt_s),
        tpot_p95_s=_p95(s.tpot_s),
        stats=run.stats,
    )


_Row = MetricRow[LongctxMetrics]


def _plain(m: LongctxMetrics) -> PolicyMetrics:
    return m.metrics


def _tail(name: str, attr: str, p95: _Row) -> list[_Row]:
    """p50, p95 (this topology's own) and p99 of a latency."""
    return [
        *lift_rows(percentile_rows(name, attr, ("p50",)), _plain),
        p95,
        *lift_rows(percentile_rows(name, attr, ("p99",)), _plain),
    ]


def _rows() -> list[tuple[str, list[_Row]]]:
    return [
        *leading_sections(
            _plain,
            _tail("TBT", "tbt_s", _Row("TBT p95", lambda m: m.tbt_p95_s, fmt_seconds, -1))
            + _tail("TPOT", "tpot_s", _Row("TPOT p95", lambda m: m.tpot_p95_s, fmt_seconds, -1))
            + lift_rows(percentile_rows("TTFT", "ttft_s", ("p50", "p99")), _plain),
        ),
        (
            "Throughput",
            [
                _Row("Finished", lambda m: m.metrics.finished, fmt_count, 1),
                _Row("Unfinished", lambda m: m.metrics.unfinished, fmt_count, -1),
                _Row("Rejected (never fits)", lambda m: m.stats.rejected, fmt_count),
            ],
        ),
        (
            "Planning",
            [
                _Row("Re-plans", lambda m: m.stats.replans, fmt_count),
                _Row("Pauses (Pause-Resume)", lambda m: m.stats.pauses, fmt_count),
                _Row("Planning wall time", lambda m: m.stats.plan_wall_s, fmt_seconds),
                _Row("Solver time share", lambda m: m.stats.solver_time_share, fmt_pct),
                _Row("Solves", lambda m: m.stats.solves.solves or None, fmt_count),
                _Row("Solves proved optimal", lambda m: _optimal_share(m.stats), fmt_pct),
                _Row("Solver gap max", lambda m: m.stats.solves.gap_max, fmt_pct),
                _Row("Solver nodes", lambda m: m.stats.solves.nodes or None, fmt_count),
                _Row("Solves stopped by the clock", lambda m: _clock_stops(m.stats), fmt_count),
                _Row(
                    "Planning wall / sim time",
                    lambda m: (
                        m.stats.plan_wall_s / m.metrics.simulated_s
                        if m.metrics.simulated_s
                        else None
                    ),
                    fmt_pct,
                ),
            ],
        ),
        (
            "Steps and memory",
            [
                _Row("Decode steps", lambda m: m.stats.decode_steps, fmt_count),
                _Row(
                    "Mean decode step",
                    lambda m: (
                        m.stats.decode_s / m.stats.decode_steps if m.stats.decode_steps else None
                    ),
                    fmt_seconds,
                    -1,
                ),
                _Row(
                    "Stall share of decode",
                    lambda m: m.stats.stall_s / m.stats.decode_s if m.stats.decode_s else None,
                    fmt_pct,
                    -1,
                ),
                _Row("Peak GPU KV use", lambda m: _peak_fraction(m.stats), fmt_pct),
                _Row("Mean GPU KV use", lambda m: m.stats.mean_gpu_use, fmt_pct),
                _Row("Simulated time", lambda m: m.metrics.simulated_s, fmt_seconds),
            ],
        ),
    ]


def _optimal_share(stats: LongctxStats) -> float | None:
    s = stats.solves
    return s.statuses.get(Status.OPTIMAL, 0) / s.solves if s.solves else None


def _clock_stops(stats: LongctxStats) -> float | None:
    return stats.solves.over_time_limit if stats.solves.solves else None


def _peak_fraction(stats: LongctxStats) -> float | None:
    if not stats.gpu_block_budget:
        return None
    return stats.peak_gpu_blocks / stats.gpu_block_budget


def longctx_table(
    metrics: Sequence[LongctxMetrics], *, title: str | None = None, caption: str | None = None
) -> Table:
    heading = title if title is not None else "Long-context replay: offload policies compared"
    table = Table(title=heading, caption=caption, header_style="bold", title_style="bold")
    table.add_column("Metric", no_wrap=True)
    for m in metrics:
        table.add_column(m.policy, justify="right", no_wrap=True, min_width=len(m.policy))
    return add_sections(table, _rows(), metrics)


def print_longctx_report(
    metrics: Sequence[LongctxMetrics],
    *,
    console: Console | None = None,
    title: str | None = None,
    caption: str | None = None,
) -> None:
    print_table(longctx_table(metrics, title=title, caption=caption), console)


def longctx_json(runs: Sequence[LongctxRun], metrics: Sequence[LongctxMetrics]) -> dict[str, Any]:
    """The replay JSON (planner.replay.report.to_json: schema, policies with
    config, totals, metrics) plus ``topology`` and per policy ``offload``."""
    data = to_json([r.result for r in runs], [m.metrics for m in metrics])
    data["topology"] = TOPOLOGY
    for entry, m in zip(data["policies"], metrics, strict=True):
        entry["offload"] = _finite(m.offload_json())
    return data


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
