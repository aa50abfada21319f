"""Whether a bounded-LVF plan could preempt anything at all: the planner's
`lvf` takes as victims only running requests with at least
preempt_slack_tbts TBT SLOs of TPOT slack, or whose TPOT SLO is lost (slack
below -lost_slack_tbts TBT SLOs); the slack is first token time + slo_tbt x
tokens generated - now. An adapter that applies only plans that preempt asks
the planner only when some running request is such a victim, and leaves
every other step to its engine at no cost. Other variants (the paper's
algorithm) may preempt anyone: always asked.

The defaults are the planner's (planner.domain.rotation.RotationParams;
a test holds them equal)."""

from __future__ import annotations

from collections.abc import Iterable

from planner.v1 import rotation_pb2

DEFAULT_PREEMPT_SLACK_TBTS = 160.0
DEFAULT_LOST_SLACK_TBTS = 10.0


class VictimGate:
    """The victim rule of one engine's rotation settings."""

    __slots__ = ("_lost_s", "_spare_s", "always", "tbt_s")

    def __init__(self, params: rotation_pb2.RotationParams | None, tbt_s: float) -> None:
        self.tbt_s = tbt_s
        variant = params.variant if params is not None else rotation_pb2.ROTATION_VARIANT_LVF
        self.always = variant not in (
            rotation_pb2.ROTATION_VARIANT_UNSPECIFIED,
            rotation_pb2.ROTATION_VARIANT_LVF,
        )
        preempt = (
            params.preempt_slack_tbts
            if params is not None and params.HasField("preempt_slack_tbts")
            else DEFAULT_PREEMPT_SLACK_TBTS
        )
        lost: float | None = DEFAULT_LOST_SLACK_TBTS
        if params is not None and params.HasField("lost_slack_tbts"):
            lost = params.lost_slack_tbts if params.lost_slack_tbts >= 0 else None
        self._spare_s = preempt * tbt_s
        self._lost_s = None if lost is None else -lost * tbt_s

    def any_victim(self, running: Iterable[tuple[float | None, int]], now_s: float) -> bool:
        """running: (first token time or None, tokens generated) of each
        running request."""
        if self.always:
            return True
        spare_s, lost_s, tbt_s = self._spare_s, self._lost_s, self.tbt_s
        for first_token_s, generated in running:
            if first_token_s is None or generated < 1:
                continue
            slack = first_token_s + tbt_s * generated - now_s
            if slack >= spare_s or (lost_s is not None and slack < lost_s):
                return True
        return False
