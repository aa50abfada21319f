"""The replay's tally of solver calls: counts by status (the typed Status),
gaps, work and clock stops summed over a run."""

from __future__ import annotations

import pytest
from planner.solvers import Backend, SolveStats, Status

from planner.replay.solve_tally import SolveTally


def _stats(
    status: Status, objective: float | None, bound: float | None, wall_s: float
) -> SolveStats:
    return SolveStats(
        backend=Backend.BRANCH_AND_BOUND,
        status=status,
        objective=objective,
        best_bound=bound,
        wall_s=wall_s,
        time_limit_s=0.01,
        nodes=100,
        node_limit=4000,
    )


def test_statuses_are_counted_by_status_gaps_and_clock_stops_summed() -> None:
    tally = SolveTally()
    tally.add(_stats(Status.OPTIMAL, 2.0, 2.0, 0.001))
    tally.add(_stats(Status.FEASIBLE, 2.0, 1.5, 0.02))
    tally.add(_stats(Status.OPTIMAL, 4.0, 4.0, 0.002))
    tally.add(_stats(Status.INFEASIBLE, None, None, 0.001))
    summary = tally.summary()
    assert summary.solves == 4
    assert summary.statuses == {Status.FEASIBLE: 1, Status.INFEASIBLE: 1, Status.OPTIMAL: 2}
    assert all(isinstance(key, Status) for key in summary.statuses)
    assert summary.gap_mean == pytest.approx(0.25 / 3)
    assert summary.gap_max == pytest.approx(0.25)
    assert summary.nodes == 400
    assert summary.wall_s == pytest.approx(0.024)
    assert summary.over_time_limit == 1
