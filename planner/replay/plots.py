"""PNG figures of a replay comparison (`--report-dir`).

Drawn with matplotlib's Agg canvas on standalone `Figure`s: no pyplot, no
display, no global backend switch. One colour per policy, the same in every
figure.

- ttft_cdf.png: CDF of TTFT over all requests, per policy (requests that
  never got a token keep the curve below 1), the TTFT SLO as a dashed line.
- tbt_cdf.png: CDF of the gaps between tokens (ms), the TBT SLO dashed.
- kv_occupancy.png: GPU KV blocks in use over simulated time per policy with
  the pool's capacity (and CPU KV blocks below, when any were used); a
  timeline whose capacity moves (serverless: KV tokens against the slices'
  room, HBM less resident weights) draws its own.
- queue_length.png: waiting and, where the topology swaps requests out,
  rotary (swapped out) requests over time (serverless: the wait queue for a
  slice, running requests, requests whose KV is in host memory).
- slices.png (serverless): per MIG slice, its KV in use against its KV
  room, its resident weights, its requests running and queued on it.
- link_load.png (serverless): the C2C link's load against its bandwidth.
- kv_stall.png (topologies whose iterations wait for KV, asked for by
  `stall=True`): the iterations' cumulative wait for KV transfers over time.
- attainment_vs_load.png (given a `--rate-scale` sweep): TTFT and token-level
  TBT attainment against the rate scale, one line per policy.

Long timelines are cut into `MAX_POINTS` bins and drawn as each bin's
maximum, so peaks survive; CDFs are drawn through `MAX_POINTS` quantiles.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator, PercentFormatter

from planner.replay.metrics import (
    FloatArray,
    P,
    PolicyMetrics,
    Sweep,
    latency_samples,
    sweep_policies,
)
from planner.replay.records import ReplayResult

MAX_POINTS = 2000
# Draw a log x axis when the positive samples span this ratio or more.
LOG_RATIO = 50.0
# At most this many distinct SLO values get a line each.
MAX_SLO_LINES = 3
DPI = 130

_COLORS = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#7f7f7f",
    "#bcbd22",
)


def policy_colors(names: Sequence[str]) -> dict[str, str]:
    colors: dict[str, str] = {}
    for name in names:
        if name not in colors:
            colors[name] = _COLORS[len(colors) % len(_COLORS)]
    return colors


def figure(width: float = 8.0, height: float = 5.0) -> Figure:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, format="png", dpi=DPI)
    return path


def _cdf_points(values: FloatArray, population: int) -> tuple[FloatArray, FloatArray]:
    """Sorted finite values and their empirical CDF over `population`
    (values missing from the population keep the curve below 1)."""
    x = np.sort(values[np.isfinite(values)])
    y = np.arange(1, x.size + 1, dtype=np.float64) / max(population, 1)
    if x.size > MAX_POINTS:
        keep = np.unique(np.linspace(0, x.size - 1, MAX_POINTS).round().astype(np.int64))
        x, y = x[keep], y[keep]
    return x, y


def _use_log(ax: Axes, samples: Sequence[FloatArray]) -> None:
    present = [s[np.isfinite(s) & (s > 0)] for s in samples]
    present = [s for s in present if s.size]
    if not present:
        return
    low = min(float(s.min()) for s in present)
    high = max(float(s.max()) for s in present)
    if high / low >= LOG_RATIO:
        ax.set_xscale("log")


def _slo_lines(ax: Axes, slos: FloatArray, scale: float, unit: str) -> bool:
    """Dashed lines at the distinct SLOs; False when there are too many
    to draw (per-request SLOs)."""
    distinct = np.unique(slos[np.isfinite(slos)])
    if distinct.size > MAX_SLO_LINES:
        return False
    for slo in distinct:
        value = float(slo) * scale
        ax.axvline(
            value, color="black", linestyle="--", linewidth=1.0, label=f"SLO {value:g} {unit}"
        )
    return True


def _cdf_axes(ax: Axes, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_ylim(0.0, 1.02)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", alpha=0.1)
    ax.legend(loc="best", fontsize="small")


def _plot_cdf(
    path: Path,
    results: Sequence[ReplayResult],
    labels: Sequence[str],
    samples: Sequence[tuple[FloatArray, FloatArray]],
    *,
    scale: float,
    unit: str,
    xlabel: str,
    ylabel: str,
    title: str,
) -> Path:
    """One CDF curve per policy with the SLO line(s); samples are (values in
    seconds, per-sample SLOs in seconds) per result."""
    fig = figure()
    ax = fig.add_subplot()
    colors = policy_colors([r.policy for r in results])
    drawn: list[FloatArray] = []
    for result, label, (values, _) in zip(results, labels, samples, strict=True):
        x, y = _cdf_points(values * scale, values.size)
        ax.plot(x, y, color=colors[result.policy], linewidth=1.8, label=label)
        drawn.append(x)
    _use_log(ax, drawn)
    slos = np.concatenate([slo for _, slo in samples]) if samples else np.zeros(0)
    one_slo = _slo_lines(ax, slos, scale, unit)
    _cdf_axes(ax, xlabel, ylabel, title + ("" if one_slo else " (per-request SLOs)"))
    return _save(fig, path)


def plot_ttft_cdf(
    path: Path, results: Sequence[ReplayResult], metrics: Sequence[PolicyMetrics]
) -> Path:
    samples = [latency_samples(r.requests) for r in results]
    labels = []
    for result, m, s in zip(results, metrics, samples, strict=True):
        label = f"{result.policy}: {_pct(m.ttft_attainment)} within SLO"
        if (missing := int(np.isnan(s.ttft_s).sum())) > 0:
            label += f", {missing:,} without a token"
        labels.append(label)
    return _plot_cdf(
        path,
        results,
        labels,
        [(s.ttft_s, s.slo_ttft_s) for s in samples],
        scale=1.0,
        unit="s",
        xlabel="TTFT (s)",
        ylabel="Requests with TTFT ≤ x",
        title="Time to first token: CDF per policy",
    )


def plot_tbt_cdf(
    path: Path, results: Sequence[ReplayResult], metrics: Sequence[PolicyMetrics]
) -> Path:
    samples = [latency_samples(r.requests) for r in results]
    labels = [
        f"{result.policy}: {_pct(m.tbt_attainment)} of gaps within SLO"
        for result, m in zip(results, metrics, strict=True)
    ]
    return _plot_cdf(
        path,
        results,
        labels,
        [(s.tbt_s, s.tbt_slo_s) for s in samples],
        scale=1e3,
        unit="ms",
        xlabel="Gap between consecutive tokens (ms)",
        ylabel="Token gaps ≤ x",
        title="Time between tokens: CDF per policy",
    )


def _envelope(time_s: FloatArray, values: FloatArray) -> tuple[FloatArray, FloatArray, bool]:
    """At most MAX_POINTS points: each time bin's maximum. True if binned."""
    if time_s.size <= MAX_POINTS:
        return time_s, values, False
    edges = np.linspace(float(time_s[0]), float(time_s[-1]), MAX_POINTS + 1)
    which = np.clip(np.searchsorted(edges, time_s, side="right") - 1, 0, MAX_POINTS - 1)
    peak = np.full(MAX_POINTS, -np.inf)
    np.maximum.at(peak, which, values)
    present = np.isfinite(peak)
    centers = (edges[:-1] + edges[1:]) / 2
    return centers[present], peak[present], True


def _series(result: ReplayResult, attr: str) -> tuple[FloatArray, FloatArray]:
    samples = result.timeline
    t = np.fromiter((s.time_s for s in samples), dtype=np.float64, count=len(samples))
    v = np.fromiter((getattr(s, attr) for s in samples), dtype=np.float64, count=len(samples))
    return t, v


def _timeline_panel(
    ax: Axes, results: Sequence[ReplayResult], attr: str, colors: dict[str, str]
) -> bool:
    binned = False
    for result in results:
        t, v = _series(result, attr)
        t, v, b = _envelope(t, v)
        binned |= b
        ax.plot(t, v, color=colors[result.policy], linewidth=1.2, label=result.policy)
    ax.grid(True, alpha=0.3)
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    return binned


def _top_legend(fig: Figure, ax: Axes) -> None:
    """One legend row above the plots, clear of the curves."""
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper center", ncols=min(len(labels), 4))


def _binned_note(fig: Figure, binned: bool) -> None:
    if binned:
        fig.text(
            0.99,
            0.005,
            f"long runs drawn as the maximum of {MAX_POINTS} time bins",
            ha="right",
            va="bottom",
            fontsize="x-small",
            color="gray",
        )


# A capacity that moves: thin and solid (a dashed line loses short peaks).
_CAPACITY_STYLE: dict[str, Any] = {"linewidth": 0.8, "alpha": 0.6}


def _moving_capacity(result: ReplayResult) -> bool:
    """Whether the timeline carries its own KV capacity at each sample."""
    return any(s.gpu_kv_blocks_capacity for s in result.timeline)


def plot_kv_occupancy(
    path: Path, results: Sequence[ReplayResult], unit: str = "blocks", cpu_label: str | None = None
) -> Path:
    """`unit`: what the timeline's and totals' GPU KV blocks count. A run
    whose capacity moves (its samples' gpu_kv_blocks_capacity) has it drawn
    thin in its colour; the others' fixed capacity is a black dashed line.
    `cpu_label`: the CPU panel's y label."""
    colors = policy_colors([r.policy for r in results])
    with_cpu = any(s.cpu_kv_blocks_used for r in results for s in r.timeline)
    fig = figure(8.0, 6.5 if with_cpu else 5.0)
    axes = fig.subplots(2 if with_cpu else 1, 1, sharex=True, squeeze=False)[:, 0]
    gpu = axes[0]
    binned = _timeline_panel(gpu, results, "gpu_kv_blocks_used", colors)
    top = 0.0
    for result in results:
        if _moving_capacity(result):
            t, v = _series(result, "gpu_kv_blocks_capacity")
            t, v, b = _envelope(t, v)
            binned |= b
            top = max(top, float(v.max()))
            gpu.plot(
                t,
                v,
                color=colors[result.policy],
                label=f"{result.policy}: capacity",
                **_CAPACITY_STYLE,
            )
    capacities = sorted({r.totals.gpu_kv_blocks_total for r in results if not _moving_capacity(r)})
    for i, capacity in enumerate(capacities):
        gpu.axhline(
            capacity,
            color="black",
            linestyle="--",
            linewidth=1.0,
            label=f"capacity ({capacity:,} {unit})" if i < MAX_SLO_LINES else None,
        )
    if capacities or top:
        gpu.set_ylim(0, max([*capacities, top, gpu.get_ylim()[1]]) * 1.04)
    gpu.set_ylabel(f"GPU KV {unit} in use")
    gpu.set_title("GPU KV cache occupancy over time")
    _top_legend(fig, gpu)
    if with_cpu:
        cpu = axes[1]
        binned |= _timeline_panel(cpu, results, "cpu_kv_blocks_used", colors)
        cpu.set_ylabel(cpu_label or f"CPU KV {unit} in use")
        cpu.set_title(f"CPU KV {unit} (swapped out)", fontsize="medium")
    axes[-1].set_xlabel("Simulated time (s)")
    _binned_note(fig, binned)
    return _save(fig, path)


def plot_queue_length(
    path: Path,
    results: Sequence[ReplayResult],
    rotary: bool = True,
    *,
    running: bool = False,
    waiting_label: str = "Waiting requests",
    rotary_label: str = "Rotary requests\n(KV swapped out)",
) -> Path:
    """`rotary`: a panel of the rotary (swapped out) requests; `running`:
    one of the running requests."""
    colors = policy_colors([r.policy for r in results])
    panels = [("waiting", waiting_label)]
    if running:
        panels.append(("running", "Running requests"))
    if rotary:
        panels.append(("rotary", rotary_label))
    fig = figure(8.0, 3.0 + 1.5 * len(panels))
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    binned = False
    for ax, (attr, label) in zip(axes, panels, strict=True):
        binned |= _timeline_panel(ax, results, attr, colors)
        ax.set_ylabel(label)
    axes[0].set_title("Queue length over time")
    _top_legend(fig, axes[0])
    axes[-1].set_xlabel("Simulated time (s)")
    _binned_note(fig, binned)
    return _save(fig, path)


def plot_kv_stall(path: Path, results: Sequence[ReplayResult]) -> Path:
    """Cumulative seconds the iterations waited for KV transfers."""
    colors = policy_colors([r.policy for r in results])
    fig = figure()
    ax = fig.add_subplot()
    binned = False
    for result in results:
        t, stall = _series(result, "stall_s")
        t, total, b = _envelope(t, np.cumsum(stall))
        binned |= b
        ax.plot(
            t,
            total,
            color=colors[result.policy],
            linewidth=1.5,
            label=f"{result.policy}: {result.totals.stall_s:.3g} s in all",
        )
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.set_xlabel("Simulated time (s)")
    ax.set_ylabel("Cumulative stall (s)")
    ax.set_title("Iterations' wait for KV transfers (not hidden by compute)")
    ax.legend(loc="best", fontsize="small")
    _binned_note(fig, binned)
    return _save(fig, path)


def _unit_line(
    ax: Axes, result: ReplayResult, index: int, attr: str, scale: float, **style: Any
) -> bool:
    """The unit's `attr` (times `scale`) over time; True if binned."""
    samples = [s for s in result.timeline if len(s.units) > index]
    t = np.fromiter((s.time_s for s in samples), dtype=np.float64, count=len(samples))
    v = np.fromiter(
        (getattr(s.units[index], attr) for s in samples), dtype=np.float64, count=len(samples)
    )
    t, v, binned = _envelope(t, v * scale)
    ax.plot(t, v, **style)
    return binned


def plot_unit_timelines(
    path: Path, results: Sequence[ReplayResult], kv_unit: str = "blocks", kind: str = "unit"
) -> Path:
    """One row per unit of the timelines' samples (`kind`: what a unit is,
    a serverless MIG slice): its KV in use against its capacity, the model
    weights resident in its memory (where any are) and its requests
    running and queued on it; one colour per policy."""
    colors = policy_colors([r.policy for r in results])
    names: list[str] = []
    for result in results:
        for sample in result.timeline:
            names.extend(u.name for u in sample.units[len(names) :])
    weights = any(u.weight_bytes for r in results for s in r.timeline for u in s.units)
    columns = 3 if weights else 2
    rows = max(len(names), 1)
    fig = figure(4.2 * columns, 1.2 + 2.0 * rows)
    axes = fig.subplots(rows, columns, sharex=True, squeeze=False)
    binned = False
    for i, name in enumerate(names):
        kv_ax, req_ax = axes[i, 0], axes[i, -1]
        for result in results:
            color = colors[result.policy]
            binned |= _unit_line(kv_ax, result, i, "kv_used", 1.0, color=color, linewidth=1.2)
            binned |= _unit_line(
                kv_ax, result, i, "kv_capacity", 1.0, color=color, **_CAPACITY_STYLE
            )
            binned |= _unit_line(req_ax, result, i, "running", 1.0, color=color, linewidth=1.2)
            binned |= _unit_line(
                req_ax, result, i, "waiting", 1.0, color=color, linestyle="--", linewidth=1.0
            )
            if weights:
                binned |= _unit_line(
                    axes[i, 1], result, i, "weight_bytes", 1e-9, color=color, linewidth=1.2
                )
        kv_ax.set_ylabel(f"{kind} {name}\nKV {kv_unit}")
        req_ax.set_ylabel("requests")
        req_ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        for ax in axes[i]:
            ax.set_ylim(0, max(ax.get_ylim()[1], 1.0))
            ax.grid(True, alpha=0.3)
    titles = [f"KV in use (thick), capacity (thin), {kv_unit}"]
    if weights:
        titles.append("Model weights resident (GB)")
    titles.append("Requests running (solid), queued on it (dashed)")
    for ax, title in zip(axes[0], titles, strict=True):
        ax.set_title(title, fontsize="medium")
    fig.supxlabel("Simulated time (s)", fontsize="medium")
    handles = [Line2D([], [], color=colors[r.policy], label=r.policy) for r in results]
    fig.legend(handles=handles, loc="outside upper center", ncols=min(len(handles), 6))
    if not names:
        axes[0, 0].text(0.5, 0.5, "no samples", ha="center", va="center")
    _binned_note(fig, binned)
    return _save(fig, path)


def time_weighted_mean(result: ReplayResult, attr: str) -> float | None:
    """The mean of a per-interval quantity (each sample's value holds since
    the previous sample) over the timeline's span."""
    t, v = _series(result, attr)
    if t.size < 2 or t[-1] <= t[0]:
        return None
    return float((v[1:] * np.diff(t)).sum() / (t[-1] - t[0]))


def plot_link_load(
    path: Path, results: Sequence[ReplayResult], capacity_gbps: float | None = None
) -> Path:
    """The shared host link's load (each sample's link_gbps: GB/s since the
    previous sample) with its sustained bandwidth dashed."""
    colors = policy_colors([r.policy for r in results])
    fig = figure()
    ax = fig.add_subplot()
    binned = False
    for result in results:
        t, v = _series(result, "link_gbps")
        t, v, b = _envelope(t, v)
        binned |= b
        mean = time_weighted_mean(result, "link_gbps")
        label = result.policy if mean is None else f"{result.policy}: mean {mean:.3g} GB/s"
        ax.plot(t, v, color=colors[result.policy], linewidth=1.2, label=label)
    if capacity_gbps is not None:
        ax.axhline(
            capacity_gbps,
            color="black",
            linestyle="--",
            linewidth=1.0,
            label=f"sustained bandwidth ({capacity_gbps:g} GB/s)",
        )
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.set_xlabel("Simulated time (s)")
    ax.set_ylabel("GB/s since the previous sample")
    ax.set_title("Host link load over time")
    _top_legend(fig, ax)
    _binned_note(fig, binned)
    return _save(fig, path)


_MARKERS = "osD^v<>ph*"


def plot_sweep_lines(
    ax: Axes,
    sweep: Mapping[float, Sequence[P]],
    get: Callable[[P], float | None],
    colors: dict[str, str],
) -> None:
    """One line per policy of a sweep (a marker each): get's value at each
    rate scale where it has one."""
    scales = sorted(sweep)
    for i, name in enumerate(sweep_policies(sweep)):
        xs: list[float] = []
        ys: list[float] = []
        for scale in scales:
            for m in sweep[scale]:
                value = get(m)
                if m.policy == name and value is not None:
                    xs.append(scale)
                    ys.append(float(value))
        ax.plot(
            xs,
            ys,
            color=colors[name],
            marker=_MARKERS[i % len(_MARKERS)],
            linewidth=1.8,
            label=name,
        )


def plot_attainment_vs_load(path: Path, sweep: Sweep) -> Path:
    scales = sorted(sweep)
    colors = policy_colors(sweep_policies(sweep))
    fig = figure(10.0, 4.5)
    ttft_ax, tbt_ax = fig.subplots(1, 2, sharey=True)
    plot_sweep_lines(ttft_ax, sweep, lambda m: m.ttft_attainment, colors)
    plot_sweep_lines(tbt_ax, sweep, lambda m: m.tbt_attainment, colors)
    for ax, title in (
        (ttft_ax, "TTFT SLO attainment vs load"),
        (tbt_ax, "Token-level TBT SLO attainment vs load"),
    ):
        ax.set_title(title)
        ax.set_xlabel("Request rate (multiple of the trace rate)")
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_ylim(-0.02, 1.02)
        ax.grid(True, alpha=0.3)
        if len(scales) <= 12:
            ax.set_xticks(scales, [f"{s:g}x" for s in scales])
    ttft_ax.set_ylabel("SLO attainment")
    _top_legend(fig, ttft_ax)
    return _save(fig, path)


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100.0 * value:.1f}%"


def write_report(
    directory: str | os.PathLike[str],
    results: Sequence[ReplayResult],
    metrics: Sequence[PolicyMetrics],
    sweep: Sweep | None = None,
    *,
    kv_unit: str = "blocks",
    rotary: bool = True,
    stall: bool = False,
) -> list[Path]:
    """Every figure into `directory` (created); the paths written.
    `results` and `metrics` pair up by position, as from `compare`. What
    the topology's timeline holds: `kv_unit`, what its GPU KV blocks count;
    `rotary`, whether it swaps requests out; `stall`, whether its
    iterations wait for KV transfers (kv_stall.png)."""
    if len(results) != len(metrics):
        raise ValueError(f"{len(results)} results but {len(metrics)} metrics")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = [
        plot_ttft_cdf(out / "ttft_cdf.png", results, metrics),
        plot_tbt_cdf(out / "tbt_cdf.png", results, metrics),
        plot_kv_occupancy(out / "kv_occupancy.png", results, kv_unit),
        plot_queue_length(out / "queue_length.png", results, rotary),
    ]
    if stall:
        written.append(plot_kv_stall(out / "kv_stall.png", results))
    if sweep:
        written.append(plot_attainment_vs_load(out / "attainment_vs_load.png", sweep))
    return written
