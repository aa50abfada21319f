"""Which Largest-VLT-First decides (RotationParams.variant), and the
engine's entry point at count level."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.domain.rotation import RotationInputs, RotationVariant
from planner.policies.rotation_bounded import decide_bounded
from planner.policies.rotation_columns import (
    Decision,
    IntArray,
    Pools,
    Ranking,
    RotationColumns,
    count_transfers,
)
from planner.policies.rotation_paper import decide_paper


def decide(
    cols: RotationColumns,
    pools: Pools,
    inputs: RotationInputs,
    ranking: Ranking,
    grouped: tuple[int, int] | None = None,
) -> Decision:
    """One iteration of the variant inputs.params names. grouped (a, b): the
    rows come grouped by state, WAITING in [0, a), RUNNING in [a, b) and
    ROTARY from b (as an engine lists them), which saves work, not changes
    the result."""
    if inputs.params.variant == RotationVariant.LVF_PAPER:
        return decide_paper(cols, pools, inputs, ranking, grouped)
    return decide_bounded(cols, pools, inputs, ranking, grouped)


@dataclass(frozen=True, slots=True)
class RowPlan:
    """What an engine carries out: rows of the columns."""

    # Preempted (by swap), in order.
    preempted: IntArray
    # Admitted or resumed, in priority order (deferred swap-ins left out).
    prioritized: IntArray
    eager_blocks: int


def plan_rows(
    cols: RotationColumns,
    pools: Pools,
    inputs: RotationInputs,
    ranking: Ranking,
    grouped: tuple[int, int] | None = None,
) -> RowPlan:
    """plan_rotation at count level, as rows (see decide for grouped)."""
    decision = decide(cols, pools, inputs, ranking, grouped)
    transfers = count_transfers(cols, pools, inputs, decision)
    prioritized = decision.prioritized
    if transfers.deferred_rows.size:
        prioritized = prioritized[~np.isin(prioritized, transfers.deferred_rows)]
    return RowPlan(decision.preemption.rows, prioritized, transfers.eager_blocks)
