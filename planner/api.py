"""The replay from Python: `planner.api.replay(trace, policies=[...], ...)`
runs what `planner replay` runs and returns its numbers as pandas tables.

    from planner.api import replay

    runs = replay("fixtures/traces/default.jsonl", policies=["fcfs", "lvf"],
                  rate_scales=[0.5, 1.0])
    runs.summary[["policy", "rate_scale", "both_attainment", "throughput_tok_s"]]
    runs.requests.groupby("policy").both_met.mean()

Knobs are the command's options with underscores for dashes
(``slo_ttft=2.0`` is ``--slo-ttft 2.0``, ``gpu_kv_gb=3`` is ``--gpu-kv-gb 3``),
checked by the same code: a bad value raises ValueError with the command's
message naming the option. ``planner replay --help`` lists them.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from planner.commands import replay as replay_command
from planner.replay.policy_registries import ROTATION
from planner.replay.records import ReplayResult
from planner.replay.request_table import request_table
from planner.trace.io import write_trace
from planner.trace.records import TraceRequest

# Options that are not knobs: the API sets or replaces them.
_NOT_KNOBS = frozenset(
    {"policy", "rate_scale", "profile", "topology", "json_out", "requests_out", "quiet"}
)


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
    **knobs: Any,
) -> ReplayRuns:
    """Replays trace (a JSON-lines file, TraceRequests, or a DataFrame with
    the trace's columns) with each policy at each rate scale on the
    identical arrivals. ValueError names a bad knob or value."""
    options = _knob_options()
    argv = ["replay", "TRACE", "--quiet", "--topology", topology]
    for name in policies or ():
        argv += ["--policy", name]
    for scale in rate_scales:
        argv += ["--rate-scale", repr(float(scale))]
    if profile is not None:
        argv += ["--profile", profile]
    for key, value in knobs.items():
        if key not in options:
            known = ", ".join(sorted(options))
            raise ValueError(f"unknown knob {key!r} (known: {known})")
        argv += [options[key], repr(value) if isinstance(value, float) else str(value)]
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


def _knob_options() -> dict[str, str]:
    """Knob name -> the command's option, for every option that takes a value."""
    parser = _parser()
    replay_parser = _replay_parser(parser)
    options: dict[str, str] = {}
    for action in replay_parser._actions:  # argparse keeps no public list
        if not action.option_strings or action.dest in _NOT_KNOBS or action.nargs == 0:
            continue
        options[action.dest] = action.option_strings[-1]
    return options


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="planner", add_help=False)
    replay_command.register(parser.add_subparsers(dest="command"))
    return parser


def _replay_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser = action.choices["replay"]
            return found
    raise LookupError("the replay command is not registered")


def _parse(argv: list[str]) -> argparse.Namespace:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return _parser().parse_args(argv)
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
