"""Paired comparison of two vllm_compare configurations over many runs: each
of the given results.json files (or folders holding one) is one pair, run
back to back on identical arrivals; per configuration the median and
interquartile range of a metric, and of the pairs' differences (B - A) the
median, an exact two-sided sign test and seeded bootstrap confidence
intervals of the mean and median difference.

    python -m planner.bench.vllm_paired out/a/pair* --a plain --b grpc \\
        [--metric both_attainment] [--metric output_tok_s]
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_METRICS = ("both_attainment", "ttft_p50_s", "ttft_p99_s", "output_tok_s", "wall_s")


@dataclass(frozen=True, slots=True)
class Spread:
    median: float
    q1: float
    q3: float
    low: float
    high: float

    @staticmethod
    def of(values: list[float]) -> Spread:
        a = np.asarray(values, dtype=float)
        q1, median, q3 = np.percentile(a, [25, 50, 75])
        return Spread(float(median), float(q1), float(q3), float(a.min()), float(a.max()))


@dataclass(frozen=True, slots=True)
class Paired:
    metric: str
    pairs: int
    a: Spread
    b: Spread
    diff: Spread
    # Pairs where B is above, below, equal to A.
    above: int
    below: int
    ties: int
    # Exact two-sided sign test over the pairs that are not ties.
    sign_test_p: float
    mean_diff: float
    mean_diff_ci: tuple[float, float]
    median_diff_ci: tuple[float, float]


def sign_test_p(above: int, below: int) -> float:
    """Two-sided exact binomial test of above vs below at p = 1/2."""
    n = above + below
    if n == 0:
        return 1.0
    k = min(above, below)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return float(min(1.0, 2 * tail))


def bootstrap_ci(
    diffs: list[float], stat: str, *, level: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean or median of diffs."""
    a = np.asarray(diffs, dtype=float)
    rng = np.random.default_rng(seed)
    samples = a[rng.integers(0, len(a), size=(resamples, len(a)))]
    values = samples.mean(axis=1) if stat == "mean" else np.median(samples, axis=1)
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def compare(a: list[float], b: list[float], metric: str) -> Paired:
    if len(a) != len(b) or not a:
        raise ValueError("need the same number (at least one) of A and B runs")
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    above = sum(d > 0 for d in diffs)
    below = sum(d < 0 for d in diffs)
    return Paired(
        metric=metric,
        pairs=len(diffs),
        a=Spread.of(a),
        b=Spread.of(b),
        diff=Spread.of(diffs),
        above=above,
        below=below,
        ties=len(diffs) - above - below,
        sign_test_p=sign_test_p(above, below),
        mean_diff=float(np.mean(diffs)),
        mean_diff_ci=bootstrap_ci(diffs, "mean"),
        median_diff_ci=bootstrap_ci(diffs, "median"),
    )


def load_pairs(paths: list[Path], a: str, b: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(A run, B run) from each results.json, in the order given; a file
    without exactly one run of each is an error naming it."""
    out = []
    for path in paths:
        file = path / "results.json" if path.is_dir() else path
        results = json.loads(file.read_text(encoding="utf-8"))["results"]
        runs = {}
        for config in (a, b):
            found = [r for r in results if r["config"] == config]
            if len(found) != 1:
                raise ValueError(f"{file}: {len(found)} runs of {config}, need exactly one")
            runs[config] = found[0]
        out.append((runs[a], runs[b]))
    return out


def _fmt(value: float, metric: str) -> str:
    if metric.endswith("attainment"):
        return f"{100 * value:.1f} %"
    if metric.endswith("_s"):
        return f"{value:.3f}"
    return f"{value:.1f}"


def markdown(rows: list[Paired], a: str, b: str) -> str:
    def spread(s: Spread, metric: str) -> str:
        return f"{_fmt(s.median, metric)} ({_fmt(s.q1, metric)}-{_fmt(s.q3, metric)})"

    def diff(value: float, metric: str) -> str:
        text = _fmt(value, metric)
        return text if text.startswith("-") else f"+{text}"

    lines = [
        f"| metric | pairs | {a}: median (IQR) | {b}: median (IQR) "
        f"| {b} - {a}: median (IQR) | 95 % CI of the median difference | mean difference "
        f"(95 % CI) | {b} above / below / tie | sign test p |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m = r.metric
        lines.append(
            f"| {m} | {r.pairs} | {spread(r.a, m)} | {spread(r.b, m)} "
            f"| {diff(r.diff.median, m)} ({diff(r.diff.q1, m)} to {diff(r.diff.q3, m)}) "
            f"| {diff(r.median_diff_ci[0], m)} to {diff(r.median_diff_ci[1], m)} "
            f"| {diff(r.mean_diff, m)} ({diff(r.mean_diff_ci[0], m)} to "
            f"{diff(r.mean_diff_ci[1], m)}) | {r.above} / {r.below} / {r.ties} "
            f"| {r.sign_test_p:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path, help="results.json files or folders")
    parser.add_argument("--a", required=True, help="the reference configuration (e.g. plain)")
    parser.add_argument("--b", required=True, help="the configuration compared with it")
    parser.add_argument("--metric", action="append", help=f"default: {', '.join(DEFAULT_METRICS)}")
    args = parser.parse_args(argv)
    try:
        pairs = load_pairs(args.results, args.a, args.b)
    except (OSError, ValueError, KeyError) as exc:
        parser.exit(2, f"vllm_paired: {exc}\n")
    rows = [
        compare([float(x[m]) for x, _ in pairs], [float(y[m]) for _, y in pairs], m)
        for m in (args.metric or DEFAULT_METRICS)
    ]
    print(markdown(rows, args.a, args.b))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
