"""How an adapter's channel to a secured `planner serve` is set up: TLS (with
a client certificate for mutual TLS) and the bearer token, from the engine's
own settings. The files are read and checked when the engine starts, so a
wrong path stops it with the setting named instead of failing every call."""

from __future__ import annotations

from dataclasses import dataclass

from planner.bearer_token import AuthConfigError, read_token
from planner.tls import ClientTls, TlsConfigError


@dataclass(frozen=True, slots=True)
class ChannelSecurity:
    tls: ClientTls | None = None
    auth_token: str | None = None

    @classmethod
    def from_settings(
        cls,
        target: str | None,
        *,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        auth_token_file: str | None = None,
        where: str,
    ) -> ChannelSecurity:
        """where names the settings in errors (e.g. `additional_config.planner`).
        Without a target (in process) there is no channel: TLS or token
        settings are an error, and $PLANNER_AUTH_TOKEN is not read."""
        tls_paths = (tls_ca, tls_cert, tls_key)
        if target is None:
            if any(p is not None for p in (*tls_paths, auth_token_file)):
                raise ValueError(f"{where}: TLS and token settings need a target")
            return cls()
        tls = None if all(p is None for p in tls_paths) else ClientTls(*tls_paths)
        try:
            if tls is not None:
                tls.credentials()
            return cls(tls, read_token(auth_token_file))
        except (TlsConfigError, AuthConfigError) as exc:
            raise ValueError(f"{where}: {exc}") from None
