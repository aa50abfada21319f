"""What both solver benches (`planner bench solvers --problem offload` and
`--problem placement`) do around a run: read the `--baseline` file, then
compare the run with it, print the report and write the JSON and the
markdown section."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from planner.bench.markdown import write_section

EXIT_OK, EXIT_REGRESSED, EXIT_BAD_INPUT = 0, 1, 2

Cases = list[dict[str, Any]]


def read_baseline(args: argparse.Namespace) -> tuple[bool, dict[str, Any] | None]:
    """(usable, the --baseline run's JSON or None when none is given); an
    unusable file or --regression-factor is reported on stderr."""
    if args.regression_factor <= 1.0:
        print("planner bench solvers: --regression-factor must be > 1", file=sys.stderr)
        return False, None
    path: Path | None = args.baseline
    if path is None:
        return True, None
    try:
        baseline = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(baseline, dict) or not isinstance(baseline.get("cases"), list):
            raise ValueError("not a JSON object with a 'cases' list")
    except (OSError, ValueError) as exc:
        print(f"planner bench solvers: cannot read baseline {path}: {exc}", file=sys.stderr)
        return False, None
    return True, baseline


def publish(  # noqa: PLR0917
    doc: dict[str, Any],
    args: argparse.Namespace,
    baseline: dict[str, Any] | None,
    compare: Callable[[Cases, dict[str, Any], float], dict[str, Any]],
    text_report: Callable[[dict[str, Any]], str],
    markdown_section: Callable[[dict[str, Any]], str],
    section: str,
) -> int:
    """Compare doc's cases with the baseline (doc["baseline"]), print the
    report, write --out and --markdown; the bench's exit status."""
    doc["baseline"] = None
    if baseline is not None:
        try:
            doc["baseline"] = compare(doc["cases"], baseline, args.regression_factor)
        except (KeyError, TypeError, ValueError) as exc:
            print(
                f"planner bench solvers: baseline {args.baseline} unusable: {exc}", file=sys.stderr
            )
            return EXIT_BAD_INPUT
    print(text_report(doc))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    if args.markdown is not None:
        write_section(args.markdown, section, markdown_section(doc))
    if doc["baseline"] is not None and doc["baseline"]["regressions"]:
        return EXIT_REGRESSED
    return EXIT_OK
