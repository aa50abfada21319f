"""What a replay's solver calls reported, summed over the run: statuses,
objective gaps, work and wall time (each plan's deciding solve)."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.solvers import SolveStats, Status


@dataclass(frozen=True, slots=True)
class SolveSummary:
    solves: int
    statuses: dict[Status, int]
    # (objective - bound) / objective over the solves that report both.
    gap_mean: float | None
    gap_max: float | None
    nodes: int
    wall_s: float
    # Solves stopped by the clock rather than by work or a proof (a run
    # whose solves all stop on work gives the same plans on any machine).
    over_time_limit: int


@dataclass
class SolveTally:
    solves: int = 0
    statuses: dict[Status, int] = field(default_factory=dict)
    gaps: list[float] = field(default_factory=list)
    nodes: int = 0
    wall_s: float = 0.0
    over_time_limit: int = 0

    def add(self, stats: SolveStats) -> None:
        self.solves += 1
        self.statuses[stats.status] = self.statuses.get(stats.status, 0) + 1
        gap = stats.gap
        if gap is not None:
            self.gaps.append(gap)
        self.nodes += stats.nodes
        self.wall_s += stats.wall_s
        if stats.wall_s >= stats.time_limit_s:
            self.over_time_limit += 1

    def summary(self) -> SolveSummary:
        return SolveSummary(
            solves=self.solves,
            statuses=dict(sorted(self.statuses.items())),
            gap_mean=sum(self.gaps) / len(self.gaps) if self.gaps else None,
            gap_max=max(self.gaps) if self.gaps else None,
            nodes=self.nodes,
            wall_s=self.wall_s,
            over_time_limit=self.over_time_limit,
        )
