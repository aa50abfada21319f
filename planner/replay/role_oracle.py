"""AQUA-PROFILER's load oracle of a deployment named by a built-in profile
(MODEL@HARDWARE): the replay simulator (planner.replay.oracle) at the
deployment's SLOs (DESIGN.md §3.4). The roles policy takes it as a callable
(planner.policies.aqua.roles.classify); the service is handed
:class:`ReplayRoleOracles` by whoever starts it (planner.service.role_oracles).
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.domain.placement import DeploymentProfile, RoleConfig, RoleDecision
from planner.domain.requests import Slo
from planner.policies.aqua.roles import DEFAULT_ATTAINMENT, Oracle, OraclePoint, classify
from planner.replay.oracle import DEFAULT_DURATION_S, evaluate
from planner.replay.setup import ReplayKnobs, build_setup
from planner.trace.records import TraceRequest


class ReplayRoleOracles:
    """The replay simulator of a profile name as a rate -> point oracle."""

    def check(self, name: str) -> None:
        """ProfileError when the replay cannot be set up for name."""
        build_setup(name, ReplayKnobs())

    def oracle(
        self,
        name: str,
        slo: Slo,
        duration_s: float | None = None,
        seed: int = 0,
        requests: Sequence[TraceRequest] | None = None,
    ) -> Oracle:
        """duration_s: simulated seconds of arrivals per rate (None: the
        oracle's default); `requests` (already read from a trace) give the
        length distribution, else the sharegpt preset."""
        setup = build_setup(name, ReplayKnobs(slo=slo))
        duration = duration_s or DEFAULT_DURATION_S

        def run(rate: float) -> OraclePoint:
            return evaluate(setup, rate, slo, duration_s=duration, seed=seed, requests=requests)

        return run


def classify_by_replay(
    profile: DeploymentProfile,
    replay_profile: str,
    config: RoleConfig | None = None,
    *,
    attainment: float = DEFAULT_ATTAINMENT,
    duration_s: float | None = None,
    seed: int = 0,
    requests: Sequence[TraceRequest] | None = None,
) -> RoleDecision:
    """classify() with the replay simulator of `replay_profile`
    (MODEL@HARDWARE) as the oracle, at the deployment's SLOs."""
    slo = Slo(ttft_s=profile.slo_ttft_s, tbt_s=profile.slo_tbt_s)
    oracle = ReplayRoleOracles().oracle(replay_profile, slo, duration_s, seed, requests)
    return classify(profile, config, oracle=oracle, attainment=attainment)
