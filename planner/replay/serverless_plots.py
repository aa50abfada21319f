"""PNG figures of a serverless replay (`--report-dir` with `--topology
serverless`), in planner.replay.plots' style (Agg canvas, one colour per
policy):

- ttft_cdf.png, tbt_cdf.png: planner.replay.plots' CDFs of the first rate
  scale's runs;
- from their timelines (runs that recorded one,
  planner.replay.serverless_timeline), planner.replay.plots' figures:
  kv_occupancy.png (KV tokens in use on all slices against their KV room,
  which moves with the resident weights; below, the KV of requests whose
  KV is in host memory), queue_length.png (the wait queue for a slice,
  running requests, requests whose KV is in host memory), slices.png (per
  slice: KV in use against its room, resident weights, requests running and
  queued on it) and link_load.png (the C2C link's load);
- attainment_vs_load.png (given a `--rate-scale` sweep): TTFT, request-level
  TPOT and both-met attainment against the rate scale, one line per policy;
- cold_start_vs_load.png (given a sweep): the p50 TTFT of cold requests
  (their model was on no slice when they arrived) against the rate scale.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.ticker import PercentFormatter

from planner.replay.metrics import sweep_policies
from planner.replay.plots import (
    DPI,
    figure,
    plot_kv_occupancy,
    plot_link_load,
    plot_queue_length,
    plot_sweep_lines,
    plot_tbt_cdf,
    plot_ttft_cdf,
    plot_unit_timelines,
    policy_colors,
)
from planner.replay.serverless_engine import ServerlessRun
from planner.replay.serverless_report import ServerlessMetrics, ServerlessSweep


def _lines(
    ax: Axes,
    sweep: ServerlessSweep,
    get: Callable[[ServerlessMetrics], float | None],
    colors: dict[str, str],
) -> None:
    scales = sorted(sweep)
    plot_sweep_lines(ax, sweep, get, colors)
    ax.set_xlabel("Request rate (multiple of the trace rate)")
    ax.set_xscale("log")
    ax.set_xticks(scales, [f"{s:g}x" for s in scales])
    ax.minorticks_off()
    ax.grid(True, alpha=0.3)


def plot_attainment_vs_load(path: Path, sweep: ServerlessSweep) -> Path:
    colors = policy_colors(sweep_policies(sweep))
    fig = figure(13.0, 4.5)
    axes = fig.subplots(1, 3, sharey=True)
    panels: list[tuple[str, Callable[[ServerlessMetrics], float | None]]] = [
        ("TTFT SLO attainment", lambda m: m.metrics.ttft_attainment),
        ("TPOT SLO attainment (request-level)", lambda m: m.metrics.tpot_attainment),
        ("Both met (goodput)", lambda m: m.metrics.both_attainment),
    ]
    for ax, (title, get) in zip(axes, panels, strict=True):
        _lines(ax, sweep, get, colors)
        ax.set_title(title)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_ylim(-0.02, 1.02)
    axes[0].set_ylabel("Requests")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper center", ncols=min(len(labels), 8))
    fig.savefig(path, format="png", dpi=DPI)
    return path


def plot_cold_start_vs_load(path: Path, sweep: ServerlessSweep) -> Path:
    colors = policy_colors(sweep_policies(sweep))
    fig = figure(8.0, 4.5)
    ax = fig.add_subplot()
    _lines(ax, sweep, lambda m: m.cold_start_s.p50, colors)
    ax.set_yscale("log")
    ax.set_ylabel("Cold-start TTFT p50 (s)")
    ax.set_title("Cold start: TTFT of requests whose model was on no slice")
    ax.legend(loc="best", fontsize="small")
    fig.savefig(path, format="png", dpi=DPI)
    return path


def write_serverless_report(
    directory: str | os.PathLike[str],
    runs: Sequence[ServerlessRun],
    metrics: Sequence[ServerlessMetrics],
    sweep: ServerlessSweep | None = None,
) -> list[Path]:
    """Every figure into ``directory`` (created); the paths written."""
    if len(runs) != len(metrics):
        raise ValueError(f"{len(runs)} runs but {len(metrics)} metrics")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    results = [r.result for r in runs]
    plain = [m.metrics for m in metrics]
    written = [
        plot_ttft_cdf(out / "ttft_cdf.png", results, plain),
        plot_tbt_cdf(out / "tbt_cdf.png", results, plain),
    ]
    if any(r.timeline for r in results):
        written += [
            plot_kv_occupancy(
                out / "kv_occupancy.png",
                results,
                "tokens",
                cpu_label="KV tokens in host memory",
            ),
            plot_queue_length(
                out / "queue_length.png",
                results,
                running=True,
                waiting_label="Waiting for a slice",
                rotary_label="Requests with KV\nin host memory",
            ),
            plot_unit_timelines(out / "slices.png", results, "tokens", kind="slice"),
            plot_link_load(out / "link_load.png", results, max(r.stats.link_gbps for r in runs)),
        ]
    if sweep and len(sweep) > 1:
        written.append(plot_attainment_vs_load(out / "attainment_vs_load.png", sweep))
        written.append(plot_cold_start_vs_load(out / "cold_start_vs_load.png", sweep))
    return written
