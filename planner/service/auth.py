"""Bearer-token authentication: a server interceptor that lets a call through
only with `authorization: Bearer <token>` metadata.

gRPC health checks stay open, so load balancers and orchestrators can probe
without the secret; everything else, server reflection included, needs the
token."""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Callable
from typing import Any

import grpc

TOKEN_ENV = "PLANNER_AUTH_TOKEN"
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/",)
_SCHEME = b"Bearer "


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


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def require_tls_off_loopback(host: str, token: str | None, tls: bool) -> None:
    """A bearer token sent in clear text off this machine can be read by
    anyone on the path: refuse that configuration."""
    if token is not None and not tls and not is_loopback(host):
        raise AuthConfigError(
            f"--auth-token-file on --host {host} needs TLS (--tls-cert/--tls-key): "
            "the token would cross the network in clear text"
        )


def bearer_metadata(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


class BearerTokenInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]
    def __init__(self, token: str) -> None:
        self._expected = _SCHEME + token.encode()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        if handler_call_details.method.startswith(OPEN_METHOD_PREFIXES):
            return continuation(handler_call_details)
        given = b""
        for key, value in handler_call_details.invocation_metadata:
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else value
                break
        handler = continuation(handler_call_details)
        if handler is None or hmac.compare_digest(given, self._expected):
            return handler
        return _refusal(handler)


def _refusal(handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same shape as the refused method's (a streaming
    client would otherwise wait on a unary answer) that answers
    UNAUTHENTICATED without reading the request."""

    def refuse(request: object, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)
