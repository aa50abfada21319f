"""The replay from Python: `planner.api.replay(trace, policies=[...], ...)`
runs what `planner replay` runs and returns its numbers as pandas tables;
`planner.api.sweep(...)` runs what `planner sweep` runs and returns its table.

    from planner.api import RotationSettings, replay, sweep

    runs = replay("fixtures/traces/default.jsonl", policies=["fcfs", "lvf"],
                  rate_scales=[0.5, 1.0], slo_ttft=2.0,
                  settings=[RotationSettings(alpha=2.0)])
    runs.summary[["policy", "rate_scale", "both_attainment", "throughput_tok_s"]]
    runs.requests.groupby("policy").both_met.mean()

    table = sweep({"trace": "fixtures/traces/default.jsonl",
                   "grid": {"policy": ["fcfs", "lvf"], "alpha": [1.0, 3.0]}})

Knobs are the settings dataclasses' fields (planner.commands.knobs: shared,
rotation, long-context, cluster, serverless), the command's options with
underscores for dashes (``slo_ttft=2.0`` is ``--slo-ttft 2.0``), given as
keywords, as settings objects, or in a YAML file (``config=``, as
``--config``); keywords win over settings objects, both over the file. They
are checked by the command's own code: a bad value raises ValueError with
the command's message naming the option (and the file's line).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from planner.commands import replay as replay_command
from planner.commands.config_file import parse_with_config
from planner.commands.knobs import (
    ClusterSettings,
    LongContextSettings,
    RotationSettings,
    ServerlessSettings,
    Settings,
    SharedSettings,
    knob_table,
    settings_values,
)
from planner.commands.sweep import run_sweep
from planner.commands.sweep_spec import read_spec, spec_from_mapping
from planner.replay.policy_registries import ROTATION
from planner.replay.records import ReplayResult
from planner.replay.request_table import request_table
from planner.trace.io import write_trace
from planner.trace.records import TraceRequest

__all__ = [
    "ClusterSettings",
    "LongContextSettings",
    "ReplayRuns",
    "RotationSettings",
    "ServerlessSettings",
    "SharedSettings",
    "replay",
    "sweep",
]


@dataclass(frozen=True)
class ReplayRuns:
    """Every run of one replay: one per policy and rate scale.

    summary: one row per run (policy, rate_scale, then every number of the
    command's JSON, nested names joined by dots, e.g. ``ttft_s.p99``).
    requests: one row per request per run (planner.replay.request_table).
    results: the runs themselves, for what the tables leave out.
    """

    summary: pd.DataFrame
    requests: pd.DataFrame
    results: tuple[ReplayResult, ...]


def replay(
    trace: str | os.PathLike[str] | Sequence[TraceRequest] | pd.DataFrame,
    *,
    policies: Iterable[str] | None = None,
    topology: str = ROTATION,
    profile: str | None = None,
    rate_scales: Iterable[float] = (1.0,),
    config: str | os.PathLike[str] | None = None,
    settings: Iterable[Settings] = (),
    **knobs: Any,
) -> ReplayRuns:
    """Replays trace (a JSON-lines file, TraceRequests, or a DataFrame with
    the trace's columns) with each policy at each rate scale on the
    identical arrivals. ValueError names a bad knob or value."""
    table = knob_table()
    argv = ["replay", "TRACE", "--quiet", "--topology", topology]
    for name in policies or ():
        argv += ["--policy", name]
    for scale in rate_scales:
        argv += ["--rate-scale", repr(float(scale))]
    if profile is not None:
        argv += ["--profile", profile]
    if config is not None:
        argv += ["--config", os.fspath(config)]
    values: dict[str, Any] = {}
    for group in settings:
        values.update({k: v for k, v in settings_values(group).items() if v is not None})
    for key, value in knobs.items():
        if key not in table:
            raise ValueError(f"unknown knob {key!r} (known: {', '.join(sorted(table))})")
        values[key] = value
    for key, value in values.items():
        if value is not None:
            argv += [table[key].flag, repr(value) if isinstance(value, float) else str(value)]
    collected: list[tuple[ReplayResult, dict[str, Any]]] = []
    with _trace_file(trace) as path:
        argv[1] = str(path)
        args = _parse(argv)
        args.collect = lambda result, summary: collected.append((result, summary))
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = replay_command.run(args)
    if code != 0:
        raise ValueError(_message(err.getvalue()))
    results = tuple(result for result, _ in collected)
    rows = [
        {"policy": result.policy, "rate_scale": result.config.get("rate_scale"), **summary}
        for result, summary in collected
    ]
    summary = pd.json_normalize(rows, sep=".") if rows else pd.DataFrame()
    return ReplayRuns(summary=summary, requests=request_table(results), results=results)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="planner", add_help=False)
    replay_command.register(parser.add_subparsers(dest="command"))
    return parser


def _parse(argv: list[str]) -> argparse.Namespace:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parse_with_config(_parser(), argv)
    except SystemExit:
        raise ValueError(_message(err.getvalue())) from None


def _message(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else "the replay failed"
    for prefix in ("planner replay: error: ", "planner replay: "):
        if last.startswith(prefix):
            return last[len(prefix) :]
    return last


@contextlib.contextmanager
def _trace_file(
    trace: str | os.PathLike[str] | Sequence[TraceRequest] | pd.DataFrame,
) -> Iterator[Path]:
    if isinstance(trace, str | os.PathLike):
        yield Path(trace)
        return
    requests = _requests_of(trace)
    with tempfile.TemporaryDirectory(prefix="planner-api-") as folder:
        path = Path(folder) / "trace.jsonl"
        write_trace(path, requests)
        yield path


def _requests_of(trace: Sequence[TraceRequest] | pd.DataFrame) -> list[TraceRequest]:
    if not isinstance(trace, pd.DataFrame):
        return list(trace)
    fields = set(TraceRequest.__dataclass_fields__)
    unknown = [c for c in trace.columns if c not in fields]
    if unknown:
        raise ValueError(f"trace: unknown columns {unknown} (known: {sorted(fields)})")
    requests = []
    for row in trace.to_dict(orient="records"):
        clean = {
            str(k): v.item() if hasattr(v, "item") else v
            for k, v in row.items()
            if not (isinstance(v, float) and pd.isna(v))
        }
        if "prefix_block_ids" in clean:
            clean["prefix_block_ids"] = tuple(int(b) for b in clean["prefix_block_ids"])
        requests.append(TraceRequest(**clean))
    return requests


def sweep(
    spec: str | os.PathLike[str] | Mapping[str, Any],
    *,
    out: str | os.PathLike[str] | None = None,
    jobs: int = 1,
    ray: str | None = None,
    quiet: bool = True,
) -> pd.DataFrame:
    """Runs a sweep (a SWEEP.yaml path, or a mapping with the same keys:
    planner.commands.sweep_spec) and returns one row per configuration, in
    the grid's order. With out (or the file's out:), rows are written there
    as they finish and the ones already there are skipped. jobs: local
    worker processes; ray: run on Ray instead ("auto", "local" or an
    address; an instance this process started with ray.init is used as it
    is). ValueError names a bad key or value (and its file and line)."""
    parsed = spec_from_mapping(spec) if isinstance(spec, Mapping) else read_spec(spec)
    target = out if out is not None else parsed.out
    report = run_sweep(
        parsed, Path(target) if target is not None else None, jobs=jobs, ray=ray, quiet=quiet
    )
    return report.table
