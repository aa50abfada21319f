"""`planner serve`: the gRPC server, with health, reflection, metrics, limits
and graceful shutdown."""

from __future__ import annotations

import gc
import logging
import resource
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message
from grpc_reflection.v1alpha import reflection
from prometheus_client import start_http_server

from planner.bearer_token import check_token
from planner.call_timing import TIMING_KEY, ServerTiming
from planner.rpc import RPCS, SERVICE_NAMES, Rpc
from planner.service.auth import BearerTokenInterceptor, require_tls_off_loopback
from planner.service.cluster_store import ClusterStore
from planner.service.connections import connection_cap
from planner.service.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    StoreUnavailableError,
)
from planner.service.health import NOT_SERVING, SERVING, HealthService
from planner.service.health import SERVICE_NAME as HEALTH_SERVICE_NAME
from planner.service.limits import ServiceLimits
from planner.service.logs import LOGGER_NAME, log_event
from planner.service.methods import CallContext, handle
from planner.service.metrics import RpcMetrics
from planner.service.offload_engines import OffloadEngines, warm_up
from planner.service.role_oracles import RoleOracles
from planner.service.serverless_tuners import ServerlessTuners
from planner.service.store_health import StoreHealth
from planner.tls import ServerTls

SHUTDOWN_GRACE_S = 5.0
# Calls in flight on one connection; above the default max_concurrent_rpcs,
# so at defaults the server-wide limit (RESOURCE_EXHAUSTED) binds first and
# this one only stops one connection from taking every slot.
MAX_CONCURRENT_STREAMS = 256
# Ping a connection idle this long, and drop it if the ping is not answered:
# a client that vanished (kill -9, cable) stops holding its streams.
KEEPALIVE_TIME_MS = 60_000
KEEPALIVE_TIMEOUT_MS = 20_000
# Clients may ping at most this often; more gets the connection closed.
MIN_CLIENT_PING_INTERVAL_MS = 10_000
# The services whose calls read or write the durable store: NOT_SERVING
# while it cannot be written.
STORE_SERVICES = (
    RPCS["ClusterService.GetClusterState"].full_service,
    RPCS["PlacementService.GetPoolStatus"].full_service,
)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 50051
    metrics_port: int | None = None
    # /metrics has no token and no TLS: loopback unless asked otherwise.
    metrics_host: str = "127.0.0.1"
    limits: ServiceLimits = field(default_factory=ServiceLimits)
    # The durable store of state that outlives a restart (ClusterService,
    # PlacementService's lease ledger): a SQLite file, or a postgresql:// URL
    # that several replicas share; None keeps it in memory.
    store_path: str | None = None
    # None listens in plaintext.
    tls: ServerTls | None = None
    # With it, every call but health checks needs `authorization: Bearer <token>`.
    auth_token: str | None = None
    # ClassifyRoles' oracle for deployments named by a profile (planner serve
    # hands in the replay simulator's); None refuses them.
    role_oracles: RoleOracles | None = None
    # GetPlannerInfo's policies (planner serve hands in the policy
    # registries' listing).
    policies: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.auth_token is not None:
            check_token(self.auth_token, "auth_token")
        require_tls_off_loopback(self.host, self.auth_token, self.tls is not None)


class PlannerServer:
    """A running planner gRPC server. port is the bound port (useful with 0)."""

    def __init__(self, config: ServerConfig) -> None:
        # Read before anything is opened: a bad file stops the server here.
        credentials = None if config.tls is None else config.tls.credentials()
        self.max_connections = connection_cap(config.limits.max_connections)
        self.config = config
        self.metrics = RpcMetrics()
        self.offload_engines = OffloadEngines()
        self.serverless_tuners = ServerlessTuners()
        # One PostgreSQL connection per worker thread, and one for the probe.
        self.cluster_store = ClusterStore(
            config.store_path, pool_size=config.limits.max_workers + 1
        )
        self.cluster_store.open()
        self.logger = logging.getLogger(LOGGER_NAME)
        limits = config.limits
        self._server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=limits.max_workers, thread_name_prefix="planner-rpc"
            ),
            maximum_concurrent_rpcs=limits.max_concurrent_rpcs,
            interceptors=(
                [] if config.auth_token is None else [BearerTokenInterceptor(config.auth_token)]
            ),
            options=[
                ("grpc.max_receive_message_length", limits.max_message_bytes),
                ("grpc.max_send_message_length", limits.max_message_bytes),
                ("grpc.so_reuseport", 0),
                ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
                ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
                ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
                ("grpc.http2.min_recv_ping_interval_without_data_ms", MIN_CLIENT_PING_INTERVAL_MS),
                ("grpc.http2.max_ping_strikes", 2),
                ("grpc.max_allowed_incoming_connections", self.max_connections),
                ("grpc.server_handshake_timeout_ms", round(limits.handshake_timeout_s * 1e3)),
                ("grpc.max_connection_idle_ms", round(limits.connection_idle_s * 1e3)),
            ],
        )
        self.health = HealthService(limits.max_health_watchers)
        self.store_health = StoreHealth(self.cluster_store.db, self.health, STORE_SERVICES)
        self._server.add_generic_rpc_handlers([*_generic_handlers(self), self.health.handler()])
        reflection.enable_server_reflection(
            [*SERVICE_NAMES, HEALTH_SERVICE_NAME, reflection.SERVICE_NAME], self._server
        )
        address = f"{_host_for_address(config.host)}:{config.port}"
        try:
            if credentials is None:
                self.port = self._server.add_insecure_port(address)
            else:
                self.port = self._server.add_secure_port(address, credentials)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {address}: {exc}") from exc
        if self.port == 0:
            raise OSError(f"cannot listen on {address}")
        self.metrics_port: int | None = None
        self._metrics_http: Any = None
        self._stopped = threading.Event()

    @property
    def address(self) -> str:
        return f"{_host_for_address(self.config.host)}:{self.port}"

    def start(self) -> None:
        # Everything allocated so far lives as long as the server: keep the
        # cyclic collector from rescanning it on every collection, which
        # otherwise shows up in decision-latency tails.
        gc.freeze()
        # Load the solver library in the background so the first offload
        # plan does not pay for it; serving does not wait.
        threading.Thread(target=warm_up, name="solver-warm-up", daemon=True).start()
        self._server.start()
        for name in ("", *SERVICE_NAMES):
            failing = name in STORE_SERVICES and self.store_health.failing
            self.health.set(name, NOT_SERVING if failing else SERVING)
        if self.config.metrics_port is not None:
            try:
                self._metrics_http, _ = start_http_server(
                    self.config.metrics_port,
                    addr=self.config.metrics_host,
                    registry=self.metrics.registry,
                )
            except OSError as exc:
                # Do not leave the gRPC server running behind the error.
                self._server.stop(None).wait()
                self._stopped.set()
                raise OSError(
                    f"cannot serve metrics on {self.config.metrics_host}:"
                    f"{self.config.metrics_port}: {exc}"
                ) from exc
            self.metrics_port = self._metrics_http.server_port
        log_event(
            self.logger,
            logging.INFO,
            "serving",
            address=self.address,
            metrics_port=self.metrics_port,
            metrics_host=self.config.metrics_host if self.metrics_port is not None else None,
            services=SERVICE_NAMES,
            store=self.cluster_store.path,
            tls="off"
            if self.config.tls is None
            else "mutual"
            if self.config.tls.client_ca_path
            else "on",
            auth="bearer" if self.config.auth_token is not None else "off",
            max_connections=self.max_connections,
            open_file_limit=resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        )

    def stop(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Stop taking calls (health turns NOT_SERVING), let calls in flight
        finish within grace_s, then stop."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.health.enter_graceful_shutdown()
        self._server.stop(grace_s).wait()
        self.store_health.close()
        self.cluster_store.close()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()
        log_event(self.logger, logging.INFO, "stopped", address=self.address)

    def wait(self) -> None:
        self._server.wait_for_termination()


def _host_for_address(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _generic_handlers(server: PlannerServer) -> list[grpc.GenericRpcHandler[Any, Any]]:
    return [_TimedHandlers(server)]


class _TimedHandlers(grpc.GenericRpcHandler):  # type: ignore[type-arg]
    """Every planner method. gRPC looks a call's method up on the server's
    polling thread, as soon as it takes the call up; that moment is the
    call's `seen` time (planner.call_timing), before the thread pool hands
    the call to a worker thread."""

    def __init__(self, server: PlannerServer) -> None:
        self._answers = {
            method.full_path: (
                _unary(server, method),
                _deserializer(method.request_type),
            )
            for method in RPCS.values()
        }

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        seen_ns = time.perf_counter_ns()
        found = self._answers.get(handler_call_details.method)
        if found is None:
            return None
        answer, parse = found
        return grpc.unary_unary_rpc_method_handler(
            lambda request, context: answer(request, context, seen_ns),
            request_deserializer=parse,
            response_serializer=_serialize,
        )


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


class _UndecodableRequest:
    """Stands for request bytes that are not a valid message."""

    def __init__(self, error: str) -> None:
        self.error = error


def _deserializer(message_type: type[Message]) -> Callable[[bytes], object]:
    def parse(data: bytes) -> object:
        try:
            return message_type.FromString(data)
        except (DecodeError, RuntimeError, ValueError) as exc:
            return _UndecodableRequest(str(exc) or "malformed message")

    return parse


def _unary(
    server: PlannerServer, method: Rpc
) -> Callable[[object, grpc.ServicerContext, int], Message]:
    limits = server.config.limits

    def answer(request: object, context: grpc.ServicerContext, seen_ns: int) -> Message:
        started_ns = time.perf_counter_ns()
        started = started_ns / 1e9
        code = grpc.StatusCode.OK
        detail = ""
        server.metrics.start(method, (started_ns - seen_ns) / 1e9)
        try:
            remaining = context.time_remaining()
            if remaining is not None and remaining <= 0:
                code, detail = grpc.StatusCode.DEADLINE_EXCEEDED, "deadline expired before start"
            elif isinstance(request, _UndecodableRequest):
                code = grpc.StatusCode.INVALID_ARGUMENT
                detail = f"request: not a valid {method.request_type.DESCRIPTOR.full_name}: "
                detail += request.error
            else:
                assert isinstance(request, Message)
                try:
                    response = handle(
                        method,
                        request,
                        CallContext(
                            limits,
                            remaining,
                            server.offload_engines,
                            server.cluster_store,
                            serverless_tuners=server.serverless_tuners,
                            role_oracles=server.config.role_oracles,
                            policies=server.config.policies,
                        ),
                    )
                    _send_timing(context, seen_ns, started_ns)
                    return response
                except InvalidArgumentError as exc:
                    code, detail = grpc.StatusCode.INVALID_ARGUMENT, str(exc)
                except FailedPreconditionError as exc:
                    code, detail = grpc.StatusCode.FAILED_PRECONDITION, str(exc)
                except StoreUnavailableError as exc:
                    code = grpc.StatusCode.UNAVAILABLE
                    detail = f"store unavailable: {exc.reason}"
                except Exception:
                    server.logger.exception(
                        "handler failed", extra={"fields": {"method": method.short_name}}
                    )
                    code, detail = grpc.StatusCode.INTERNAL, "internal error (see server log)"
            context.abort(code, detail)
        finally:
            elapsed = time.perf_counter_ns() / 1e9 - started
            server.metrics.observe(method, code.name, elapsed)
            log_event(
                server.logger,
                logging.DEBUG if code == grpc.StatusCode.OK else logging.WARNING,
                "rpc",
                method=method.short_name,
                code=code.name,
                latency_ms=round(elapsed * 1e3, 3),
                peer=context.peer(),
                **({"detail": detail} if detail else {}),
            )
        raise AssertionError("unreachable: context.abort raises")

    return answer


def _send_timing(context: grpc.ServicerContext, seen_ns: int, started_ns: int) -> None:
    """The call's server moments in its trailing metadata, when asked for."""
    if any(key == TIMING_KEY for key, _ in context.invocation_metadata()):
        timing = ServerTiming(seen_ns, started_ns, time.perf_counter_ns())
        context.set_trailing_metadata(((TIMING_KEY, timing.header()),))
