"""The mark of a scheduler that hands a preempted request's blocks to
PlannerSwapConnector before vLLM frees them (PlannerScheduler and
PlannerSyncScheduler carry it; the connector refuses to run under a
scheduler without it)."""


class HandsOverPreemptedBlocks:
    """Mixin without state: only its presence in the class's bases counts."""
