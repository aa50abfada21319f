"""`planner sweep SWEEP.yaml`: replay every configuration of a grid (any
knob, trace, policy, rate scale; planner.commands.sweep_spec) with local
worker processes or on a Ray cluster, one row per configuration in a
Parquet or CSV table. A sweep run again skips the rows its table already
holds, so an interrupted sweep resumes where it stopped."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from planner.commands.config_file import ConfigError, add_config_argument
from planner.commands.sweep_run import (
    Outcome,
    RayUnavailableError,
    run_here,
    run_in_processes,
    run_on_ray,
)
from planner.commands.sweep_spec import Configuration, SweepSpec, read_spec
from planner.output_paths import OutputPathError, check_output_file
from planner.replay.outputs import TABLE_SUFFIXES, write_table

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
OVER_TIME_LIMIT = "offload.solves.over_time_limit"


class SweepError(ValueError):
    """A configuration the replay refused, or an output it cannot take."""


@dataclass(frozen=True)
class SweepReport:
    # The grid's rows, in the grid's order (those a resumed run skipped too).
    table: pd.DataFrame
    ran: int
    skipped: int
    wall_s: float


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "sweep",
        help="replay a grid of configurations into one table",
        description="Replay every configuration of SWEEP.yaml's grid (any knob of `planner "
        "replay`, any trace, policy and rate scale) and write one row per configuration: "
        "the configuration, then goodput, tokens/s, attainments, tails and every other "
        "number of the replay's summary. Rows already in the output are skipped (resume). "
        "Solvers stop on work limits, so a grid gives the same rows on any machine.",
    )
    p.add_argument("sweep", metavar="SWEEP.yaml", help="the sweep: fixed keys and a grid")
    p.add_argument(
        "--out",
        type=Path,
        metavar="FILE.parquet|FILE.csv",
        help="the table (default: the sweep file's out:)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="local worker processes (default: one per CPU, here "
        f"{os.cpu_count() or 1}); 1 runs in this process",
    )
    p.add_argument(
        "--ray",
        metavar="auto|local|ADDRESS",
        help="run on a Ray cluster instead (the `ray` extra): auto, the cluster this "
        "machine belongs to; local, a new one here; or a cluster's address",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_config_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        spec = read_spec(args.sweep)
        out = args.out if args.out is not None else spec.out
        if out is None:
            raise SweepError("name the output: --out FILE or out: in the sweep file")
        report = run_sweep(
            spec, Path(out), jobs=args.jobs, ray=args.ray, quiet=args.quiet, console=_stderr()
        )
    except (ConfigError, SweepError, RayUnavailableError) as exc:
        print(f"planner sweep: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        print(f"planner sweep: cannot write{where}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    print(
        f"wrote {out}: {len(report.table)} configurations ({report.ran} run, "
        f"{report.skipped} already there) in {report.wall_s:.1f} s"
    )
    clocked = clock_limited_rows(report.table)
    if clocked:
        print(
            f"planner sweep: warning: {clocked} rows had solves stopped by the wall-clock "
            f"backstop ({OVER_TIME_LIMIT} > 0), not by their work limit: those rows may "
            "differ on another machine (raise offload_time_limit)",
            file=sys.stderr,
        )
    return 0


def clock_limited_rows(table: pd.DataFrame) -> int:
    """Rows whose solver calls the clock stopped rather than work."""
    if OVER_TIME_LIMIT not in table.columns:
        return 0
    return int((table[OVER_TIME_LIMIT].fillna(0) > 0).sum())


def _stderr() -> Console:
    return Console(stderr=True)


def run_sweep(
    spec: SweepSpec,
    out: Path | None,
    *,
    jobs: int = 1,
    ray: str | None = None,
    quiet: bool = True,
    console: Console | None = None,
) -> SweepReport:
    """Runs the configurations out does not hold yet, writing out after
    each; returns the grid's rows. Raises SweepError naming the sweep
    file's line when the replay refuses a configuration."""
    if jobs < 1:
        raise SweepError(f"--jobs must be >= 1, got {jobs}")
    earlier = _read_earlier(out) if out is not None else None
    done_ids = set(earlier["config_id"]) if earlier is not None else set()
    todo = [c for c in spec.configurations if c.config_id not in done_ids]
    rows: dict[str, dict[str, object]] = {}
    failure: list[str] = []
    started = time.perf_counter()
    console = console or _stderr()
    progress = Progress(
        TextColumn("sweep"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("configurations"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        # As the replay's bar: on a terminal only.
        disable=quiet or not console.is_terminal,
    )

    def on_outcome(outcome: Outcome) -> bool:
        config = spec.configurations[outcome.index]
        if outcome.row is None:
            failure.append(_failure(spec, config, outcome.error or "the replay failed"))
            return False
        rows[config.config_id] = outcome.row
        if out is not None:
            write_table(out, _table(spec, earlier, rows, everything=True), sys.stdout)
        progress.advance(task)
        return True

    with progress:
        task = progress.add_task("sweep", total=len(todo))
        _runner(todo, jobs, ray)(on_outcome)
    if failure:
        raise SweepError(failure[0])
    return SweepReport(
        table=_table(spec, earlier, rows, everything=False),
        ran=len(rows),
        skipped=len(spec.configurations) - len(todo),
        wall_s=time.perf_counter() - started,
    )


def _runner(
    todo: Sequence[Configuration], jobs: int, ray: str | None
) -> Callable[[Callable[[Outcome], bool]], None]:
    if ray is not None:
        return lambda on_outcome: run_on_ray(todo, ray, on_outcome)
    if jobs == 1 or len(todo) <= 1:
        return lambda on_outcome: run_here(todo, on_outcome)
    return lambda on_outcome: run_in_processes(todo, min(jobs, len(todo)), on_outcome)


def _failure(spec: SweepSpec, config: Configuration, message: str) -> str:
    located = spec.origins.locate(message)
    named = ", ".join(f"{k}={v}" for k, v in config.columns().items() if k != "config_id")
    return f"{located} (configuration {config.index}: {named})"


def check_out(out: Path) -> None:
    """out can take the table: a .parquet or .csv file in a folder that can
    be written. Raises SweepError."""
    if out.suffix.lower() not in TABLE_SUFFIXES:
        raise SweepError(f"--out {out}: must end in {' or '.join(TABLE_SUFFIXES)}")
    try:
        check_output_file("--out", out)
    except OutputPathError as exc:
        raise SweepError(str(exc)) from None


def _read_earlier(out: Path) -> pd.DataFrame | None:
    check_out(out)
    if not out.exists():
        return None
    try:
        if out.suffix.lower() == ".csv":
            table = pd.read_csv(out, dtype={"config_id": str})
        else:
            table = pd.read_parquet(out)
    except (OSError, ValueError) as exc:
        raise SweepError(f"--out {out}: cannot read the earlier rows to resume: {exc}") from None
    if "config_id" not in table.columns:
        raise SweepError(f"--out {out}: not a sweep's table (no config_id column)")
    return table


def _table(
    spec: SweepSpec,
    earlier: pd.DataFrame | None,
    rows: dict[str, dict[str, object]],
    *,
    everything: bool,
) -> pd.DataFrame:
    """The grid's rows in its order (earlier ones included); with
    everything, the earlier rows of other grids after them."""
    new = pd.DataFrame(list(rows.values()))
    frames = [f for f in (earlier, new) if f is not None and not f.empty]
    if not frames:
        return pd.DataFrame()
    table = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    table = table.drop_duplicates("config_id", keep="last")
    order = {c.config_id: c.index for c in spec.configurations}
    rank = table["config_id"].map(order)
    if not everything:
        table = table[rank.notna()]
        rank = rank[rank.notna()]
    table = table.assign(_rank=rank.fillna(len(order))).sort_values("_rank", kind="stable")
    return table.drop(columns="_rank").reset_index(drop=True)
