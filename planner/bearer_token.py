"""The bearer token a server requires and a client sends: read from a file
or $PLANNER_AUTH_TOKEN, checked, and put in a call's metadata. The server's
side (the interceptor) is planner.service.auth."""

from __future__ import annotations

import os

TOKEN_ENV = "PLANNER_AUTH_TOKEN"


class AuthConfigError(ValueError):
    """A token that cannot be used, or one that would travel in clear text."""


def read_token(path: str | None, flag: str = "--auth-token-file") -> str | None:
    """The token in file path (surrounding whitespace dropped), else
    $PLANNER_AUTH_TOKEN, else None (no authentication). A variable that is
    set but empty is refused, not read as "no token": that is how a secret
    missing from a deployment looks."""
    if path is None:
        if TOKEN_ENV not in os.environ:
            return None
        token = os.environ[TOKEN_ENV].strip()
        if not token:
            raise AuthConfigError(f"${TOKEN_ENV} is set but empty; unset it to run without a token")
        check_token(token, f"${TOKEN_ENV}")
        return token
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise AuthConfigError(f"{flag}: cannot read {path}: {exc}") from None
    if not token:
        raise AuthConfigError(f"{flag}: {path} is empty")
    check_token(token, flag)
    return token


def check_token(token: str, flag: str) -> None:
    """gRPC metadata values are printable ASCII; a token with anything else
    could not be sent by any client."""
    if not token:
        raise AuthConfigError(f"{flag}: the token is empty")
    if not all("!" <= c <= "~" for c in token):
        raise AuthConfigError(
            f"{flag}: the token must be printable ASCII without whitespace (! to ~)"
        )


def bearer_metadata(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)
