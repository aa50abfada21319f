"""Compare a run with an earlier one (--baseline OLD.json) and flag
regressions: a case whose median grew beyond the noise factor."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from planner.bench.results import CaseResult, results_from_json

DEFAULT_FACTOR = 1.2


@dataclass(frozen=True, slots=True)
class CaseComparison:
    level: str
    requests: int
    path: str
    form: str
    old_p50_ms: float
    new_p50_ms: float
    old_p99_ms: float
    new_p99_ms: float
    p50_ratio: float
    regressed: bool


def compare(
    results: list[CaseResult], baseline: dict[str, Any], factor: float = DEFAULT_FACTOR
) -> dict[str, Any]:
    """Cases present in both runs, matched by (level, requests, path, form). A case
    regressed when its new p50 exceeds factor x the old p50. The p99 is shown,
    not judged: a few hundred calls make it too noisy to gate on."""
    old = {r.key: r for r in results_from_json(baseline)}
    compared = []
    for r in results:
        before = old.get(r.key)
        if before is None:
            continue
        ratio = r.stats.p50_ms / before.stats.p50_ms if before.stats.p50_ms > 0 else float("inf")
        compared.append(
            CaseComparison(
                level=r.level,
                requests=r.requests,
                path=r.path,
                form=r.form,
                old_p50_ms=before.stats.p50_ms,
                new_p50_ms=r.stats.p50_ms,
                old_p99_ms=before.stats.p99_ms,
                new_p99_ms=r.stats.p99_ms,
                p50_ratio=ratio,
                regressed=ratio > factor,
            )
        )
    return {
        "factor": factor,
        "baseline_date": baseline.get("date"),
        "baseline_commit": (baseline.get("machine", {}).get("git") or {}).get("commit"),
        "baseline_cpu": baseline.get("machine", {}).get("cpu_model"),
        "cases": [asdict(c) for c in compared],
        "regressions": sum(c.regressed for c in compared),
        "unmatched": len(results) - len(compared),
    }
