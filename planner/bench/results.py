"""Measured cases and the report a bench run writes (JSON for machines)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from planner.bench.stats import LatencyStats

SCHEMA_VERSION = 1

# How a decision was reached, fastest path first, and how the request was
# encoded: "domain" (a prebuilt Snapshot, the policy path), or the proto's
# "rows" (TrackedRequest messages) or "columns" (RequestColumns).
PATHS = ("policy", "rpc", "grpc")
FORMS = ("domain", "columns", "rows")
PATH_LABELS = {
    ("policy", "domain"): "plan_rotation, domain snapshot",
    ("rpc", "columns"): "in-process RPC, columns",
    ("rpc", "rows"): "in-process RPC, rows",
    ("grpc", "columns"): "gRPC loopback, columns",
    ("grpc", "rows"): "gRPC loopback, rows",
}
LEVELS = ("counts", "block")

Key = tuple[str, int, str, str]


@dataclass(frozen=True, slots=True)
class PlanSummary:
    """What the measured decision decided: proof that it did real work."""

    fcfs_fallback: bool
    prioritized: int
    preempted: int
    block_moves: int
    blocks_needed: int
    free_gpu_blocks: int
    response_bytes: int

    def describe(self) -> str:
        if self.fcfs_fallback:
            return "FCFS (no contention)"
        text = f"LVF: {self.prioritized} prioritized, {self.preempted} preempted"
        return text + (f", {self.block_moves} block moves" if self.block_moves else "")


@dataclass(frozen=True, slots=True)
class CaseResult:
    level: str
    requests: int
    path: str
    form: str
    stats: LatencyStats
    plan: PlanSummary
    # Serialized request size; None on the policy path (no proto).
    request_bytes: int | None = None

    @property
    def key(self) -> Key:
        return (self.level, self.requests, self.path, self.form)

    @property
    def label(self) -> str:
        return PATH_LABELS.get((self.path, self.form), f"{self.path}, {self.form}")

    def to_json(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "requests": self.requests,
            "path": self.path,
            "form": self.form,
            **self.stats.to_json(),
            "request_bytes": self.request_bytes,
            "plan": asdict(self.plan),
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> CaseResult:
        request_bytes = data.get("request_bytes")
        return CaseResult(
            level=str(data["level"]),
            requests=int(data["requests"]),
            path=str(data["path"]),
            form=str(data["form"]),
            stats=LatencyStats.from_json(data),
            plan=PlanSummary(**data["plan"]),
            request_bytes=None if request_bytes is None else int(request_bytes),
        )


def sort_key(result: CaseResult) -> tuple[int, int, int, int]:
    return (
        LEVELS.index(result.level),
        result.requests,
        PATHS.index(result.path),
        FORMS.index(result.form),
    )


@dataclass(slots=True)
class Report:
    bench: str
    date: str
    command: str
    machine: dict[str, Any]
    config: dict[str, Any]
    results: list[CaseResult]
    targets: list[dict[str, Any]] = field(default_factory=list)
    reference: dict[str, Any] = field(default_factory=dict)
    grpc_floor: LatencyStats | None = None
    baseline: dict[str, Any] | None = None

    def find(self, level: str, requests: int, path: str, form: str) -> CaseResult | None:
        for r in self.results:
            if r.key == (level, requests, path, form):
                return r
        return None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "schema": SCHEMA_VERSION,
            "bench": self.bench,
            "date": self.date,
            "command": self.command,
            "machine": self.machine,
            "config": self.config,
            "results": [r.to_json() for r in self.results],
            "targets": self.targets,
            "reference": self.reference,
            "grpc_floor": None if self.grpc_floor is None else self.grpc_floor.to_json(),
        }
        if self.baseline is not None:
            data["baseline"] = self.baseline
        return data


def results_from_json(data: dict[str, Any]) -> list[CaseResult]:
    """The measured cases of a report written by to_json (for --baseline)."""
    if data.get("schema") != SCHEMA_VERSION:
        raise ValueError(f"unknown bench report schema {data.get('schema')!r}")
    return [CaseResult.from_json(r) for r in data["results"]]
