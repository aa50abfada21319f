"""The options the benches share for where a run's results go (--out,
--markdown) and what they are compared with (--baseline,
--regression-factor), and their part of the command that reproduces a run."""

from __future__ import annotations

import argparse
from pathlib import Path

from planner.bench.baseline import DEFAULT_FACTOR

CASE_REGRESSION = "a case whose p50 exceeds this times the baseline's"


def add_output_options(p: argparse.ArgumentParser) -> None:
    """--out FILE (the run as JSON) and --markdown FILE (the bench's section)."""
    p.add_argument("--out", type=Path, help="write results and machine info as JSON")
    p.add_argument("--markdown", type=Path, help="(re)write this bench's section of this file")


def add_baseline_options(p: argparse.ArgumentParser, regression: str = CASE_REGRESSION) -> None:
    """--baseline FILE and --regression-factor, whose help says that it flags
    `regression`."""
    p.add_argument("--baseline", type=Path, help="a JSON from --out to compare with")
    p.add_argument(
        "--regression-factor",
        type=float,
        default=DEFAULT_FACTOR,
        help=f"flag {regression} (default {DEFAULT_FACTOR})",
    )


def result_command_args(args: argparse.Namespace) -> list[str]:
    """--out, --markdown, --baseline as given, and --regression-factor where
    it matters (a baseline is given) and is not the default."""
    parts = []
    for flag, path in (
        ("--out", args.out),
        ("--markdown", args.markdown),
        ("--baseline", args.baseline),
    ):
        if path is not None:
            parts += [flag, str(path)]
    if args.baseline is not None and args.regression_factor != DEFAULT_FACTOR:
        parts += ["--regression-factor", f"{args.regression_factor:g}"]
    return parts
