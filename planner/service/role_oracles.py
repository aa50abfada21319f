"""Where ClassifyRoles gets the load oracle of a deployment that names a
built-in profile (replay_profile) instead of a measured curve.

The oracle is the replay simulator (planner.replay.role_oracle.ReplayRoleOracles);
the service does not import the replay (DESIGN.md §1), so whoever starts it
(`planner serve`, a bench, a test) hands one in: ServerConfig.role_oracles,
CallContext.role_oracles. Without one, such a deployment is refused with
FAILED_PRECONDITION."""

from __future__ import annotations

from typing import Protocol

from planner.domain.requests import Slo
from planner.policies.aqua.roles import Oracle


class RoleOracles(Protocol):
    def check(self, name: str) -> None:
        """ProfileError when no oracle can be built for the profile name."""

    def oracle(self, name: str, slo: Slo, duration_s: float | None, seed: int) -> Oracle:
        """The profile's rate -> point oracle at the SLOs; duration_s None:
        the oracle's default."""
