"""Bearer-token authentication: a server interceptor that lets a call through
only with `authorization: Bearer <token>` metadata.

gRPC health checks stay open, so load balancers and orchestrators can probe
without the secret; everything else, server reflection included, needs the
token. Reading the token and sending it: planner.bearer_token."""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Callable
from typing import Any

import grpc

from planner.bearer_token import AuthConfigError

OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/",)
_SCHEME = b"Bearer "


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
