"""The serverless comparison: a table with policies as columns (the rotation
table's conventions), a load-sweep table (TTFT / TPOT / both-met attainment
per rate scale), and the replay JSON with a ``serverless`` block per policy
(and the sweep). TTFT/TPOT attainment and percentiles are
planner.replay.metrics'; this adds model switches and their latency
(decision to slice ready), preemptions and KV moves, the cold start (TTFT
of the requests whose arrival found their model on no slice) and its ratio
to c2cserve's, how long models waited for a slice against the starvation
bound, the C2C link utilization and the mean rho."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from planner.policies.serverless import GIVE_UP, MOVE, QUEUE_BACK
from planner.replay.console import print_table
from planner.replay.metric_table import MetricRow, add_sections, lift_rows
from planner.replay.metrics import Distribution, PolicyMetrics, summarize
from planner.replay.report import (
    DASH,
    fmt_count,
    fmt_pct,
    fmt_seconds,
    leading_sections,
    percentile_rows,
    sweep_table_of,
    to_json,
)
from planner.replay.serverless_engine import ServerlessRun, ServerlessStats

TOPOLOGY = "serverless"


# Cold starts are compared with this policy's.
COLD_START_REFERENCE = "c2cserve"


@dataclass(frozen=True, slots=True)
class ServerlessMetrics:
    metrics: PolicyMetrics
    stats: ServerlessStats
    switch_s: Distribution
    cold_start_s: Distribution
    placement_wait_s: Distribution
    # This policy's cold-start p50 over the reference's (None: either has
    # no cold start, or no reference in the run).
    cold_start_ratio: float | None = None

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
            "preemptions": s.preemptions,
            "evictions": dict(s.evictions),
            "shares": s.shares,
            "drains": s.drains,
            "max_drain_s": s.max_drain_s,
            "kv_swaps": s.kv_swaps,
            "rejected": s.rejected,
            "cold_start_s": self.cold_start_s.to_json(),
            "cold_start_ratio": self.cold_start_ratio,
            "cold_start_reference": COLD_START_REFERENCE,
            "placement_wait_s": self.placement_wait_s.to_json(),
            "starvation_bound_s": s.starvation_bound_s,
            "max_waiting_models": s.max_waiting_models,
            "max_iteration_s": s.max_iteration_s,
            "max_switch_s": s.max_switch_s,
            "sheds": s.sheds,
            "share_ends": dict(s.share_ends),
            "disk_reads": s.disk_reads,
            "host_evictions": s.host_evictions,
        }


def _dist(values: Sequence[float]) -> Distribution:
    return Distribution.of(np.array(values, dtype=np.float64))


def summarize_serverless(run: ServerlessRun) -> ServerlessMetrics:
    return ServerlessMetrics(
        metrics=summarize(run.result),
        stats=run.stats,
        switch_s=_dist(run.stats.switch_latency_s),
        cold_start_s=_dist(run.stats.cold_ttft_s),
        placement_wait_s=_dist(run.stats.placement_wait_s),
    )


def compare_serverless(runs: Sequence[ServerlessRun]) -> list[ServerlessMetrics]:
    """Every run's metrics, with its cold start against the reference's."""
    metrics = [summarize_serverless(r) for r in runs]
    ref = next((m for m in metrics if m.policy == COLD_START_REFERENCE), None)
    base = ref.cold_start_s.p50 if ref is not None else None
    out = []
    for m in metrics:
        p50 = m.cold_start_s.p50
        ratio = p50 / base if p50 is not None and base else None
        out.append(dataclasses.replace(m, cold_start_ratio=ratio))
    return out


def _num(value: float | None) -> str:
    return DASH if value is None else f"{value:.2f}"


_Row = MetricRow[ServerlessMetrics]


def _ends(m: ServerlessMetrics, action: str) -> float:
    return float(dict(m.stats.share_ends).get(action, 0))


def _plain(m: ServerlessMetrics) -> PolicyMetrics:
    return m.metrics


def _rows() -> list[tuple[str, list[_Row]]]:
    tails = ("p50", "p99")
    return [
        *leading_sections(
            _plain,
            lift_rows(
                percentile_rows("TTFT", "ttft_s", tails) + percentile_rows("TPOT", "tpot_s", tails),
                _plain,
            ),
        ),
        (
            "Model switches",
            [
                _Row("Switches", lambda m: m.stats.switches, fmt_count),
                _Row("Switch latency p50", lambda m: m.switch_s.p50, fmt_seconds, -1),
                _Row("Switch latency p99", lambda m: m.switch_s.p99, fmt_seconds, -1),
                _Row("Cold-start TTFT p50", lambda m: m.cold_start_s.p50, fmt_seconds, -1),
                _Row(
                    f"Cold start / {COLD_START_REFERENCE}'s", lambda m: m.cold_start_ratio, _ratio
                ),
                _Row("Preemptions", lambda m: m.stats.preemptions, fmt_count),
                _Row("Shared slices (models taking turns)", lambda m: m.stats.shares, fmt_count),
                _Row("Residents shed (busy shared slice)", lambda m: m.stats.sheds, fmt_count),
                _Row("Shares ended: idle left", lambda m: _ends(m, GIVE_UP), fmt_count),
                _Row("Shares ended: busy moved", lambda m: _ends(m, MOVE), fmt_count),
                _Row("Shares ended: busy queued", lambda m: _ends(m, QUEUE_BACK), fmt_count),
                _Row("KV swaps (room)", lambda m: m.stats.kv_swaps, fmt_count),
            ],
        ),
        (
            "Waiting for a slice",
            [
                _Row("Wait p99", lambda m: m.placement_wait_s.p99, fmt_seconds, -1),
                _Row("Wait max", lambda m: m.placement_wait_s.max, fmt_seconds, -1),
                _Row("Drains (starving)", lambda m: m.stats.drains, fmt_count),
                _Row("Longest drain", lambda m: m.stats.max_drain_s, fmt_seconds),
                _Row("Starvation bound", lambda m: m.stats.starvation_bound_s, fmt_seconds),
            ],
        ),
        (
            "Link and knobs",
            [
                _Row("C2C link utilization", lambda m: m.stats.link_utilization, fmt_pct),
                _Row("Mean rho", lambda m: m.stats.mean_rho, _num),
                _Row("Finished", lambda m: m.metrics.finished, fmt_count, 1),
                _Row("Unfinished", lambda m: m.metrics.unfinished, fmt_count, -1),
                _Row("Rejected (KV never fits)", lambda m: m.stats.rejected, fmt_count),
            ],
        ),
    ]


def _ratio(value: float | None) -> str:
    return DASH if value is None else f"{value:.2f}x"


ServerlessSweep = Mapping[float, Sequence[ServerlessMetrics]]


def serverless_sweep_table(sweep: ServerlessSweep) -> Table:
    """One row per rate scale: TTFT / TPOT / both-met attainment per policy,
    and each policy's cold start against the reference's."""
    return sweep_table_of(
        sweep,
        f"SLO attainment vs load (TTFT / TPOT / both met; cold start vs {COLD_START_REFERENCE})",
        lambda m: (
            f"{fmt_pct(m.metrics.ttft_attainment)} / {fmt_pct(m.metrics.tpot_attainment)} / "
            f"{fmt_pct(m.metrics.both_attainment)}; {_ratio(m.cold_start_ratio)}"
        ),
    )


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
    runs: Sequence[ServerlessRun],
    metrics: Sequence[ServerlessMetrics],
    sweep: ServerlessSweep | None = None,
) -> dict[str, Any]:
    """Every number of the first rate scale's runs; with a sweep, every
    scale's metrics too (the rotation JSON's ``sweep``, plus a
    ``serverless`` block per policy)."""
    data = to_json(
        [r.result for r in runs],
        [m.metrics for m in metrics],
        sweep={k: [m.metrics for m in v] for k, v in sweep.items()} if sweep else None,
    )
    data["topology"] = TOPOLOGY
    for entry, m in zip(data["policies"], metrics, strict=True):
        entry["serverless"] = m.serverless_json()
    if sweep:
        for point in data["sweep"]:
            by_name = {m.policy: m for m in sweep[point["rate_scale"]]}
            for entry in point["metrics"]:
                entry["serverless"] = by_name[entry["policy"]].serverless_json()
    return data
