"""The comparison a replay prints (a rich table, policies as columns) and the
JSON it writes for machines (every number, plus each run's config)."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table

from planner.replay.console import print_table
from planner.replay.metric_table import M, MetricRow, add_sections, lift_rows
from planner.replay.metrics import Distribution, P, PolicyMetrics, Sweep, sweep_policies
from planner.replay.outputs import write_json_document
from planner.replay.records import ReplayResult

SCHEMA_VERSION = 1

# ---------------------------------------------------------------- formatting

DASH = "—"


def fmt_pct(value: float | None) -> str:
    return DASH if value is None else f"{100.0 * value:.1f}%"


def _num(value: float) -> str:
    """About three significant digits, thousands separated."""
    size = abs(value)
    if size >= 100 or value == 0:
        return f"{value:,.0f}"
    if size >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def fmt_seconds(value: float | None) -> str:
    """Milliseconds below a second, seconds from there."""
    if value is None:
        return DASH
    if value == 0:
        return "0 s"
    return f"{_num(value * 1e3)} ms" if abs(value) < 1.0 else f"{_num(value)} s"


def fmt_bytes(value: int) -> str:
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def fmt_rate(value: float | None, unit: str) -> str:
    return DASH if value is None else f"{_num(value)} {unit}".rstrip()


# ---------------------------------------------------------------- the table

Getter = Callable[[PolicyMetrics], float | None]


_Row = MetricRow[PolicyMetrics]


def percentile_rows(
    name: str, attr: str, percentiles: Sequence[str] = ("p50", "p90", "p99")
) -> list[_Row]:
    """Rows of a latency distribution's percentiles (lower is better)."""
    rows: list[_Row] = []
    for pct in percentiles:

        def get(m: PolicyMetrics, attr: str = attr, pct: str = pct) -> float | None:
            dist: Distribution = getattr(m, attr)
            value: float | None = getattr(dist, pct)
            return value

        rows.append(_Row(f"{name} {pct}", get, fmt_seconds, -1))
    return rows


def fmt_count(value: float | None) -> str:
    return DASH if value is None else f"{value:,.0f}"


def goodput_rows() -> list[_Row]:
    """The first section of every topology's table."""
    return [
        _Row("TTFT and TPOT met", lambda m: m.both_attainment, fmt_pct, +1),
        _Row("Output tokens/s", lambda m: m.throughput_tok_s, lambda v: fmt_rate(v, ""), 1),
        _Row("TBT met (token-level)", lambda m: m.tbt_attainment, fmt_pct, +1),
    ]


def attainment_rows() -> list[_Row]:
    """The second section of every topology's table: request-level
    attainment of each target."""
    return [
        _Row("TTFT", lambda m: m.ttft_attainment, fmt_pct, +1),
        _Row("TPOT (request-level)", lambda m: m.tpot_attainment, fmt_pct, +1),
    ]


def leading_sections(
    part: Callable[[M], PolicyMetrics], latency: Sequence[MetricRow[M]]
) -> list[tuple[str, list[MetricRow[M]]]]:
    """The sections a topology's table begins with, read from the `part`
    of its metrics that is a PolicyMetrics: goodput, SLO attainment and its
    latency rows."""
    return [
        ("Goodput", lift_rows(goodput_rows(), part)),
        ("SLO attainment", lift_rows(attainment_rows(), part)),
        ("Latency", list(latency)),
    ]


def _sections() -> list[tuple[str, list[_Row]]]:
    return [
        *leading_sections(
            lambda m: m,
            percentile_rows("TTFT", "ttft_s")
            + percentile_rows("TBT", "tbt_s")
            + percentile_rows("TPOT", "tpot_s"),
        ),
        (
            "Throughput",
            [
                _Row("Requests/s", lambda m: m.throughput_req_s, lambda v: fmt_rate(v, ""), 1),
                _Row("Finished", lambda m: m.finished, fmt_count, +1),
                _Row("Unfinished", lambda m: m.unfinished, fmt_count, -1),
            ],
        ),
        (
            "Preemption and transfers",
            [
                _Row("Preemptions", lambda m: m.preemptions, fmt_count),
                _Row("Swap-outs (rotations)", lambda m: m.swap_outs, fmt_count),
                _Row("Swap-ins", lambda m: m.swap_ins, fmt_count),
                _Row("Recomputed tokens", lambda m: m.recomputed_tokens, fmt_count),
                _Row("Bytes GPU→CPU", lambda m: m.bytes_d2h, lambda v: fmt_bytes(int(v or 0))),
                _Row("Bytes CPU→GPU", lambda m: m.bytes_h2d, lambda v: fmt_bytes(int(v or 0))),
                _Row("Stall time", lambda m: m.stall_s, fmt_seconds, -1),
                _Row("Stall fraction", lambda m: m.stall_fraction, fmt_pct, -1),
            ],
        ),
        (
            "Memory and run",
            [
                _Row("Peak GPU KV blocks", lambda m: m.peak_gpu_kv_blocks, fmt_count),
                _Row("Peak GPU KV use", lambda m: m.peak_gpu_kv_fraction, fmt_pct),
                _Row("Prefix-cache hit rate", lambda m: m.prefix_hit_rate, fmt_pct),
                _Row("Iterations", lambda m: m.iterations, fmt_count),
                _Row("Simulated time", lambda m: m.simulated_s, fmt_seconds),
                _Row(
                    "Simulated s / wall s",
                    lambda m: m.sim_speed,
                    lambda v: DASH if v is None else f"{_num(v)}x",
                ),
            ],
        ),
    ]


def comparison_table(
    metrics: Sequence[PolicyMetrics], *, title: str | None = None, caption: str | None = None
) -> Table:
    """Metrics as rows, one column per policy; the best value of a ranked
    row is bold green (highest attainment and throughput, lowest latency)."""
    heading = title if title is not None else "Replay: policies compared"
    table = Table(
        title=heading,
        caption=caption,
        header_style="bold",
        title_style="bold",
        min_width=len(heading) + 4,
    )
    table.add_column("Metric", no_wrap=True)
    for m in metrics:
        table.add_column(m.policy, justify="right", no_wrap=True)
    return add_sections(table, _sections(), metrics)


def sweep_table(sweep: Sweep, *, title: str | None = None) -> Table:
    """Attainment per rate scale: one row per scale, both met / TTFT / TBT
    per policy."""
    return sweep_table_of(
        sweep,
        title
        if title is not None
        else "SLO attainment vs load (TTFT and TPOT met / TTFT / TBT token-level)",
        lambda m: (
            f"{fmt_pct(m.both_attainment)} / {fmt_pct(m.ttft_attainment)} / "
            f"{fmt_pct(m.tbt_attainment)}"
        ),
    )


def sweep_table_of(
    sweep: Mapping[float, Sequence[P]], title: str, cell: Callable[[P], str]
) -> Table:
    """A topology's sweep table: one row per rate scale, one column per
    policy, cell's text of the policy's metrics at that scale."""
    table = Table(title=title, header_style="bold", title_style="bold")
    table.add_column("Rate scale", justify="right")
    policies = sweep_policies(sweep)
    for name in policies:
        table.add_column(name, justify="right", no_wrap=True)
    for scale in sorted(sweep):
        by_name = {m.policy: m for m in sweep[scale]}
        table.add_row(
            f"{scale:g}",
            *(DASH if (m := by_name.get(name)) is None else cell(m) for name in policies),
        )
    return table


def print_report(
    metrics: Sequence[PolicyMetrics],
    *,
    console: Console | None = None,
    title: str | None = None,
    caption: str | None = None,
    sweep: Sweep | None = None,
) -> None:
    """The comparison table (and the sweep's, when given) on the terminal."""
    print_table(comparison_table(metrics, title=title, caption=caption), console)
    if sweep:
        print_table(sweep_table(sweep), console)


# ---------------------------------------------------------------- JSON


def _jsonable(value: Any) -> Any:
    """Config values as JSON: dataclasses as dicts, paths as strings,
    non-finite floats as None, anything else unknown as its str()."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((_jsonable(v) for v in value), key=str)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


def to_json(
    results: Sequence[ReplayResult],
    metrics: Sequence[PolicyMetrics],
    *,
    sweep: Sweep | None = None,
    include_requests: bool = False,
) -> dict[str, Any]:
    """Every number of the comparison: per policy its config, totals and
    metrics (and with `include_requests`, every request outcome and timeline
    sample); the sweep's metrics per rate scale when given."""
    if len(results) != len(metrics):
        raise ValueError(f"{len(results)} results but {len(metrics)} metrics")
    policies: list[dict[str, Any]] = []
    for result, m in zip(results, metrics, strict=True):
        if result.policy != m.policy:
            raise ValueError(f"result {result.policy!r} paired with metrics {m.policy!r}")
        entry: dict[str, Any] = {
            "policy": result.policy,
            "config": _jsonable(result.config),
            "totals": _jsonable(dataclasses.asdict(result.totals)),
            "metrics": _jsonable(m.to_json()),
        }
        if include_requests:
            entry["requests"] = [_jsonable(dataclasses.asdict(r)) for r in result.requests]
            entry["timeline"] = [_jsonable(dataclasses.asdict(s)) for s in result.timeline]
        policies.append(entry)
    data: dict[str, Any] = {"schema": SCHEMA_VERSION, "policies": policies}
    if sweep is not None:
        data["sweep"] = [
            {"rate_scale": float(scale), "metrics": [_jsonable(m.to_json()) for m in sweep[scale]]}
            for scale in sorted(sweep)
        ]
    return data


def _check_schema(data: Mapping[str, Any]) -> None:
    if data.get("schema") != SCHEMA_VERSION:
        raise ValueError(f"replay JSON schema {data.get('schema')!r}, expected {SCHEMA_VERSION}")


def metrics_from_json(data: Mapping[str, Any]) -> list[PolicyMetrics]:
    """The per-policy metrics back from `to_json`'s output."""
    _check_schema(data)
    return [PolicyMetrics.from_json(p["metrics"]) for p in data["policies"]]


def sweep_from_json(data: Mapping[str, Any]) -> dict[float, list[PolicyMetrics]] | None:
    _check_schema(data)
    points = data.get("sweep")
    if points is None:
        return None
    return {
        float(p["rate_scale"]): [PolicyMetrics.from_json(m) for m in p["metrics"]] for p in points
    }


def write_json(
    path: str | os.PathLike[str],
    results: Sequence[ReplayResult],
    metrics: Sequence[PolicyMetrics],
    *,
    sweep: Sweep | None = None,
    include_requests: bool = False,
    stdout: TextIO = sys.stdout,
) -> Path:
    """`to_json` written whole or not at all (see planner.replay.outputs);
    parent folders are created, and `-` is standard output."""
    data = to_json(results, metrics, sweep=sweep, include_requests=include_requests)
    write_json_document(path, data, stdout)
    return Path(path)
