"""`planner serve`: run the gRPC server until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import threading
from types import FrameType

from planner.bearer_token import TOKEN_ENV, AuthConfigError, read_token
from planner.commands.config_file import add_config_argument, origins_of
from planner.replay.policy_registries import served_policies
from planner.replay.role_oracle import ReplayRoleOracles
from planner.service.connections import raise_descriptor_limit
from planner.service.limits import ServiceLimits
from planner.service.logs import configure
from planner.service.server import PlannerServer, ServerConfig
from planner.tls import ServerTls, TlsConfigError

# gRPC takes these timeouts in int32 milliseconds; a day is plenty.
MAX_TIMEOUT_S = 86_400.0


def default_store_path() -> str:
    """$PLANNER_STORE, else planner/planner.sqlite3 under the XDG state
    folder ($XDG_STATE_HOME, default ~/.local/state)."""
    env = os.environ.get("PLANNER_STORE")
    if env:
        return env
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return os.path.join(state, "planner", "planner.sqlite3")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    defaults = ServiceLimits()
    p = subparsers.add_parser(
        "serve",
        help="run the planner gRPC server",
        description="Serve every planner RPC, gRPC health and server reflection. "
        "Stops gracefully on SIGTERM/SIGINT: health turns NOT_SERVING, calls in flight finish.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=50051, help="port (default 50051; 0 picks one)")
    p.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus metrics over HTTP on this port (0 picks one); off by default",
    )
    p.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address the metrics endpoint binds (default 127.0.0.1: it has no token and "
        "no TLS; give 0.0.0.0 or an address for a Prometheus on another machine)",
    )
    p.add_argument("--max-workers", type=int, default=defaults.max_workers)
    p.add_argument(
        "--max-concurrent-rpcs",
        type=int,
        default=defaults.max_concurrent_rpcs,
        help="calls in progress at once; more are refused with RESOURCE_EXHAUSTED",
    )
    p.add_argument(
        "--max-requests-per-snapshot", type=int, default=defaults.max_requests_per_snapshot
    )
    p.add_argument("--max-message-bytes", type=int, default=defaults.max_message_bytes)
    p.add_argument(
        "--max-health-watchers",
        type=int,
        default=defaults.max_health_watchers,
        help="open grpc.health.v1 Watch streams at most; more are refused with "
        f"RESOURCE_EXHAUSTED (default {defaults.max_health_watchers})",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=defaults.max_connections,
        help="connections open at once, idle or not; more are closed when accepted. Lowered "
        "to fit the open-file limit, whose soft value is raised to the hard one at start "
        f"(default {defaults.max_connections})",
    )
    p.add_argument(
        "--handshake-timeout-s",
        type=float,
        default=defaults.handshake_timeout_s,
        help="drop a connection whose handshake has not finished by then "
        f"(default {defaults.handshake_timeout_s:g})",
    )
    p.add_argument(
        "--connection-idle-s",
        type=float,
        default=defaults.connection_idle_s,
        help="close a connection with no call in flight for this long "
        f"(default {defaults.connection_idle_s:g})",
    )
    p.add_argument(
        "--store",
        default=None,
        help="where the state that survives a restart is kept (buddy-group plans, drop "
        "triggers, memory lease ledgers): a SQLite file, or a PostgreSQL URL "
        "(postgresql://USER@HOST:PORT/DATABASE; several replicas may share it; give the "
        "password in $PGPASSWORD or ~/.pgpass rather than the URL); ':memory:' keeps none "
        "(default $PLANNER_STORE, else $XDG_STATE_HOME/planner/planner.sqlite3)",
    )
    p.add_argument("--tls-cert", help="PEM certificate chain: serve TLS (with --tls-key)")
    p.add_argument("--tls-key", help="PEM private key of --tls-cert (unencrypted)")
    p.add_argument(
        "--tls-client-ca",
        help="PEM CA: mutual TLS, every client must present a certificate it signed",
    )
    p.add_argument(
        "--auth-token-file",
        help="file holding a bearer token every call but health checks must carry "
        f"(`authorization: Bearer <token>`); default ${TOKEN_ENV}, else no token. "
        "Off loopback it needs TLS",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-format", default="json", choices=["json", "text"])
    add_config_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    origins = origins_of(args)
    for name in (
        "max_workers",
        "max_concurrent_rpcs",
        "max_requests_per_snapshot",
        "max_message_bytes",
        "max_health_watchers",
        "max_connections",
        "handshake_timeout_s",
        "connection_idle_s",
    ):
        value = getattr(args, name)
        if not (math.isfinite(value) and value > 0):
            message = f"--{name.replace('_', '-')} must be > 0"
            print(f"planner serve: {origins.locate(message)}", file=sys.stderr)
            return 2
        if name.endswith("_s") and value > MAX_TIMEOUT_S:
            message = f"--{name.replace('_', '-')} must be at most {MAX_TIMEOUT_S:g}"
            print(f"planner serve: {origins.locate(message)}", file=sys.stderr)
            return 2
    try:
        config = _config(args)
    except (TlsConfigError, AuthConfigError) as exc:
        print(f"planner serve: {origins.locate(str(exc))}", file=sys.stderr)
        return 2
    configure(args.log_level, args.log_format)
    # Handlers first: a supervisor may signal as soon as it reads the
    # "serving" line below, and the default action would kill the process.
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    raise_descriptor_limit()
    try:
        server = PlannerServer(config)
        server.start()
    except TlsConfigError as exc:
        print(f"planner serve: {origins.locate(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"planner serve: {exc}", file=sys.stderr)
        return 1
    print(f"planner serving on {server.address}", flush=True)
    if server.metrics_port is not None:
        host = _host_for_url(args.metrics_host)
        print(f"metrics on http://{host}:{server.metrics_port}/metrics", flush=True)
    stop.wait()
    server.stop()
    return 0


def _config(args: argparse.Namespace) -> ServerConfig:
    if (args.tls_cert is None) != (args.tls_key is None):
        raise TlsConfigError("--tls-cert and --tls-key go together")
    if args.tls_client_ca is not None and args.tls_cert is None:
        raise TlsConfigError("--tls-client-ca needs --tls-cert and --tls-key")
    tls = None
    if args.tls_cert is not None:
        tls = ServerTls(args.tls_cert, args.tls_key, args.tls_client_ca)
    return ServerConfig(
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        limits=ServiceLimits(
            max_requests_per_snapshot=args.max_requests_per_snapshot,
            max_message_bytes=args.max_message_bytes,
            max_workers=args.max_workers,
            max_concurrent_rpcs=args.max_concurrent_rpcs,
            max_health_watchers=args.max_health_watchers,
            max_connections=args.max_connections,
            handshake_timeout_s=args.handshake_timeout_s,
            connection_idle_s=args.connection_idle_s,
        ),
        store_path=args.store if args.store is not None else default_store_path(),
        tls=tls,
        auth_token=read_token(args.auth_token_file),
        role_oracles=ReplayRoleOracles(),
        policies=served_policies(),
    )


def _host_for_url(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
