"""`planner call Service.Method --json FILE`: one decision, JSON in and out.

In process when no --target is given (the same handlers the server runs),
else over gRPC. Exit codes: 0 answered, 2 bad input (one line on stderr
naming the field), 1 anything else (unreachable server, deadline, ...).
"""

from __future__ import annotations

import argparse
import sys

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from planner.bearer_token import TOKEN_ENV, AuthConfigError, read_token
from planner.client import PlannerClient, PlannerError, RetryPolicy
from planner.input_file import InputFileError, display_name, read_bytes
from planner.replay.policy_registries import served_policies
from planner.replay.role_oracle import ReplayRoleOracles
from planner.rpc import RPCS, Rpc
from planner.service.cluster_store import ClusterStore
from planner.service.convert.json_errors import describe_json_error
from planner.service.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    StoreUnavailableError,
)
from planner.service.limits import ServiceLimits
from planner.service.methods import CallContext, handle
from planner.tls import ClientTls, TlsConfigError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
# As large as the default gRPC message limit; a snapshot of the default
# maximum of 100,000 requests is about 25 MB of JSON.
MAX_REQUEST_JSON_BYTES = 64 * 1024 * 1024


class CallFailedError(Exception):
    def __init__(self, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    methods = ", ".join(sorted(RPCS))
    p = subparsers.add_parser(
        "call",
        help="answer one RPC from a JSON request (in process, or --target a server)",
        description=f"Send one request as proto3 JSON and print the response. Methods: {methods}",
    )
    p.add_argument("method", help="Service.Method, e.g. RotationService.PlanRotation")
    p.add_argument(
        "--json",
        dest="json_path",
        default="-",
        help="request as proto3 JSON: a file, or - for stdin (default)",
    )
    p.add_argument(
        "--target",
        help="host:port of a planner server, or several separated by commas (replicas, "
        "balanced round robin); in process when omitted",
    )
    p.add_argument(
        "--store",
        help="in process only: the store of cluster state and lease ledgers to read and "
        "update, a SQLite file or a postgresql:// URL (default: none, state lives for this "
        "call only)",
    )
    p.add_argument(
        "--deadline-ms", type=float, default=10_000.0, help="deadline of the call (default 10 s)"
    )
    p.add_argument("--tls-ca", help="with --target: use TLS, trusting this PEM CA")
    p.add_argument("--tls-cert", help="with --target: PEM client certificate (mutual TLS)")
    p.add_argument("--tls-key", help="with --target: PEM private key of --tls-cert")
    p.add_argument(
        "--auth-token-file",
        help=f"with --target: file holding the server's bearer token (default ${TOKEN_ENV})",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        rpc = _rpc(args.method)
        _check_deadline(args.deadline_ms)
        request = parse_request(rpc, _read(args.json_path))
        tls, token = _security(args)
        response = answer(
            rpc,
            request,
            args.target,
            args.deadline_ms / 1e3,
            args.store,
            tls=tls,
            auth_token=token,
        )
    except CallFailedError as exc:
        print(f"planner call: {exc}", file=sys.stderr)
        return exc.exit_code
    print(to_json(response))
    return EXIT_OK


def _security(args: argparse.Namespace) -> tuple[ClientTls | None, str | None]:
    """The TLS settings and bearer token of a call to --target."""
    tls_flags = (args.tls_ca, args.tls_cert, args.tls_key)
    if args.target is None:
        if any(f is not None for f in tls_flags) or args.auth_token_file is not None:
            raise CallFailedError(
                EXIT_BAD_INPUT, "--tls-ca/--tls-cert/--tls-key/--auth-token-file need --target"
            )
        return None, None
    tls = None if all(f is None for f in tls_flags) else ClientTls(*tls_flags)
    try:
        if tls is not None:
            tls.credentials()
        return tls, read_token(args.auth_token_file)
    except (TlsConfigError, AuthConfigError) as exc:
        raise CallFailedError(EXIT_BAD_INPUT, str(exc)) from None


def _check_deadline(deadline_ms: float) -> None:
    if not 0 < deadline_ms < float("inf"):
        raise CallFailedError(
            EXIT_BAD_INPUT, f"--deadline-ms: must be a finite number > 0, got {deadline_ms}"
        )


def _rpc(name: str) -> Rpc:
    try:
        return RPCS[name]
    except KeyError:
        known = ", ".join(sorted(RPCS))
        raise CallFailedError(EXIT_BAD_INPUT, f"unknown method {name!r} (known: {known})") from None


def _read(path: str) -> str:
    """The request's JSON text: a regular file, or standard input for "-"."""
    try:
        return read_bytes(path, MAX_REQUEST_JSON_BYTES).decode("utf-8")
    except InputFileError as exc:
        raise CallFailedError(EXIT_BAD_INPUT, f"--json {exc}") from None
    except UnicodeDecodeError as exc:
        raise CallFailedError(
            EXIT_BAD_INPUT, f"--json {display_name(path)}: not UTF-8 text ({exc.reason})"
        ) from None


def parse_request(rpc: Rpc, text: str) -> Message:
    request = rpc.request_type()
    try:
        json_format.Parse(text, request)
    except RecursionError:
        raise CallFailedError(
            EXIT_BAD_INPUT, f"request is not a valid {rpc.name} JSON: nested too deeply"
        ) from None
    except json_format.ParseError as exc:
        reason = describe_json_error(str(exc))
        raise CallFailedError(
            EXIT_BAD_INPUT, f"request is not a valid {rpc.name} JSON: {reason}"
        ) from None
    return request


def answer(
    rpc: Rpc,
    request: Message,
    target: str | None,
    deadline_s: float,
    store: str | None = None,
    *,
    tls: ClientTls | None = None,
    auth_token: str | None = None,
) -> Message:
    if target is None:
        cluster_store = ClusterStore(store)
        try:
            cluster_store.open()
            return handle(
                rpc,
                request,
                CallContext(
                    ServiceLimits(),
                    deadline_s,
                    cluster_store=cluster_store,
                    role_oracles=ReplayRoleOracles(),
                    policies=served_policies(),
                ),
            )
        except InvalidArgumentError as exc:
            raise CallFailedError(EXIT_BAD_INPUT, str(exc)) from None
        except FailedPreconditionError as exc:
            raise CallFailedError(EXIT_FAILED, f"FAILED_PRECONDITION: {exc}") from None
        except StoreUnavailableError as exc:
            raise CallFailedError(EXIT_FAILED, f"UNAVAILABLE: store unavailable: {exc}") from None
        except OSError as exc:
            raise CallFailedError(EXIT_FAILED, str(exc)) from None
        finally:
            cluster_store.close()
    if store is not None:
        raise CallFailedError(EXIT_BAD_INPUT, "--store applies in process only (no --target)")
    with PlannerClient(
        target, deadline_s=deadline_s, retry=RetryPolicy(), tls=tls, auth_token=auth_token
    ) as client:
        try:
            return client.call(rpc, request)
        except PlannerError as exc:
            code = EXIT_BAD_INPUT if exc.code == grpc.StatusCode.INVALID_ARGUMENT else EXIT_FAILED
            raise CallFailedError(code, f"{exc.code.name}: {exc.details}") from None


def to_json(message: Message) -> str:
    return json_format.MessageToJson(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
        indent=2,
    )
