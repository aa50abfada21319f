"""One JSON line per scheduled step that had requests waiting: vLLM's own
waiting order, what the planner's plan prioritized and preempted, what was
applied, and what the step then admitted and preempted. For telling what a
plan changed against vLLM's own policy on a real load
(additional_config.planner.decision_log). Plain Python, no vLLM."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from planner.adapters.common.apply import PlanActions

# What a step did with the plan.
NO_PLAN = "none"
# Not asked: no running request could be a victim (victim_gate.py).
NO_VICTIM = "no-victim"
FCFS = "fcfs"
APPLIED = "applied"
# Plans judged no better than vLLM's own order (see the scheduler).
SAME_AS_ENGINE = "engine-order"
OBSERVED = "observed"


class DecisionLog:
    def __init__(self, path: str | Path) -> None:
        # Open as long as the scheduler lives (closed at its shutdown).
        self._file: IO[str] = Path(path).open("a", encoding="utf-8", buffering=1)  # noqa: SIM115

    def step(
        self,
        *,
        now_s: float,
        engine_order: Sequence[str],
        actions: PlanActions | None,
        applied: str,
        admitted: Sequence[str],
        preempted: Sequence[str],
        free_blocks_before: int,
        running_before: int,
    ) -> None:
        record = {
            "t": round(now_s, 6),
            "engine_order": list(engine_order),
            "prioritized": list(actions.resume) if actions is not None else None,
            "plan_preempted": list(actions.preempt) if actions is not None else None,
            "applied": applied,
            "admitted": list(admitted),
            "preempted": list(preempted),
            "free_blocks": free_blocks_before,
            "running": running_before,
        }
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self._file.close()
