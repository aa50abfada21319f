"""Plugin settings, read from the SGLang server's environment (SGLang calls
the entry point with no arguments, in every scheduler process)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..common.link import DEFAULT_DEADLINE_S
from ..common.security import ChannelSecurity

TARGET_VAR = "PLANNER_TARGET"
DEADLINE_VAR = "PLANNER_DEADLINE_MS"
DISABLE_VAR = "PLANNER_SGLANG_DISABLE"
# TLS and bearer token of the channel to PLANNER_TARGET, as `planner call`'s
# --tls-ca, --tls-cert, --tls-key and --auth-token-file (the token also from
# $PLANNER_AUTH_TOKEN).
SECURITY_VARS = {
    "tls_ca": "PLANNER_TLS_CA",
    "tls_cert": "PLANNER_TLS_CERT",
    "tls_key": "PLANNER_TLS_KEY",
    "auth_token_file": "PLANNER_AUTH_TOKEN_FILE",
}


class ConfigError(ValueError):
    """Names the environment variable that is wrong."""


@dataclass(frozen=True, slots=True)
class PluginConfig:
    # "host:port" of a planner server; None runs the planner in process.
    target: str | None = None
    deadline_s: float = DEFAULT_DEADLINE_S
    enabled: bool = True
    security: ChannelSecurity = field(default_factory=ChannelSecurity)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PluginConfig:
        target = env.get(TARGET_VAR, "").strip() or None
        deadline_s = DEFAULT_DEADLINE_S
        raw = env.get(DEADLINE_VAR, "").strip()
        if raw:
            try:
                deadline_ms = float(raw)
            except ValueError:
                raise ConfigError(f"{DEADLINE_VAR}: not a number: {raw!r}") from None
            if not (math.isfinite(deadline_ms) and deadline_ms > 0):
                raise ConfigError(f"{DEADLINE_VAR}: must be > 0 ms, got {raw!r}")
            deadline_s = deadline_ms / 1000.0
        enabled = env.get(DISABLE_VAR, "").strip() not in ("1", "true", "yes")
        paths = {key: env.get(var, "").strip() or None for key, var in SECURITY_VARS.items()}
        names = "/".join(SECURITY_VARS.values())
        try:
            security = ChannelSecurity.from_settings(target, **paths, where=names)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        return cls(target=target, deadline_s=deadline_s, enabled=enabled, security=security)
