"""`planner trace stats` as readable tables (rich)."""

from __future__ import annotations

import io
from typing import TextIO

from rich import box
from rich.console import Console
from rich.table import Table

from planner.trace.human import format_duration
from planner.trace.stats import LengthStats, TraceStats

_MAX_MODELS_SHOWN = 15


def _num(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def _overview(stats: TraceStats, title: str) -> Table:
    table = Table(title=title, box=box.SIMPLE, show_header=False, title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    w = stats.windows
    rows = [
        ("requests", f"{stats.requests:,}"),
        ("first / last arrival", f"{stats.first_arrival_s:.3f} s / {stats.last_arrival_s:.3f} s"),
        ("span", format_duration(stats.span_s)),
        ("mean rate", f"{_num(stats.mean_rate_rps, '.3f')} rps"),
        ("burstiness (inter-arrival CV)", _num(stats.interarrival_cv, ".3f")),
        (
            f"rate in {w.window_s:g} s windows (min / median / max)",
            f"{_num(w.min_rps)} / {_num(w.median_rps)} / {_num(w.max_rps)} rps"
            f" ({len(w.rates_rps)} full window{'' if len(w.rates_rps) == 1 else 's'})",
        ),
        ("prompt tokens / s", _num(stats.prompt_tokens_per_s, ",.0f")),
        ("output tokens / s", _num(stats.output_tokens_per_s, ",.0f")),
    ]
    if stats.with_prefix_blocks:
        rows.append(("requests with prefix blocks", f"{stats.with_prefix_blocks:,}"))
    if stats.with_slo:
        rows.append(("requests with an SLO", f"{stats.with_slo:,}"))
    if stats.tenants:
        rows.append(("tenants", f"{len(stats.tenants):,}"))
    for name, value in rows:
        table.add_row(name, value)
    return table


def _lengths_table(stats: TraceStats) -> Table:
    table = Table(title="lengths (tokens)", box=box.SIMPLE, title_justify="left")
    table.add_column("")
    for head in ("mean", "p50", "p90", "p99", "min", "max"):
        table.add_column(head, justify="right")

    def row(name: str, s: LengthStats) -> None:
        table.add_row(
            name,
            f"{s.mean:,.1f}",
            f"{s.p50:,.0f}",
            f"{s.p90:,.0f}",
            f"{s.p99:,.0f}",
            f"{s.min:,}",
            f"{s.max:,}",
        )

    row("prompt", stats.prompt)
    row("output", stats.output)
    return table


def _models_table(stats: TraceStats) -> Table:
    title = f"models ({len(stats.models)})"
    table = Table(title=title, box=box.SIMPLE, title_justify="left")
    table.add_column("model")
    table.add_column("requests", justify="right")
    table.add_column("share", justify="right")
    shown = list(stats.models.items())[:_MAX_MODELS_SHOWN]
    for name, count in shown:
        table.add_row(name, f"{count:,}", f"{100 * count / stats.requests:.1f} %")
    rest = len(stats.models) - len(shown)
    if rest > 0:
        others = sum(list(stats.models.values())[_MAX_MODELS_SHOWN:])
        table.add_row(f"({rest} more)", f"{others:,}", f"{100 * others / stats.requests:.1f} %")
    return table


def render_stats(stats: TraceStats, title: str) -> str:
    """The tables as plain text (no colour codes, no trailing blanks)."""
    console = Console(
        file=io.StringIO(), width=100, record=True, color_system=None, highlight=False
    )
    console.print(_overview(stats, title))
    console.print(_lengths_table(stats))
    if stats.models:
        console.print(_models_table(stats))
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    return "\n".join(lines).strip("\n") + "\n"


def print_stats(stats: TraceStats, title: str, file: TextIO) -> None:
    file.write(render_stats(stats, title))
