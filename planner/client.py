"""A small planner client: a deadline on every call and bounded retries.

Retries use gRPC's own retry machinery (a service config on the channel):
only UNAVAILABLE and RESOURCE_EXHAUSTED are retried, with exponential
backoff, at most max_attempts times, and never past the call's deadline.
With wait_for_ready, a call made while the server is unreachable (restarting)
waits for it, within the deadline, instead of failing at once. Engine
adapters reuse this client with a deadline of a few milliseconds.

TLS (ClientTls: the CA to trust, a client certificate for mutual TLS) and a
bearer token (sent as `authorization` metadata on every call) are optional.

Several targets (planner replicas on one shared store: a list, or one
string with commas) are balanced by gRPC's round_robin policy over their
addresses (planner.targets): each call goes to the next replica that is
up, and a retry after UNAVAILABLE to another one. Calls of the services
that keep per-engine state in memory (planner.affinity) go instead to the
replica their engine (or GPU) id hashes to, and to its next choice while
that one is down, so an engine's controller stays on one replica. With
TLS, every replica's certificate must name the first target's host.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import grpc
from google.protobuf.message import Message

from planner.affinity import affinity_key, rendezvous_order
from planner.bearer_token import bearer_metadata
from planner.call_timing import TIMING_KEY, ServerTiming
from planner.rpc import RPCS, Rpc
from planner.targets import Replicas, resolve, split_targets
from planner.tls import ClientTls
from planner.v1 import info_pb2, rotation_pb2

DEFAULT_DEADLINE_S = 1.0
MIN_BACKOFF_S = 0.002
# First wait before reconnecting to a server that went away.
INITIAL_RECONNECT_BACKOFF_S = 0.1


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 3
    initial_backoff_s: float = 0.002
    max_backoff_s: float = 0.1
    backoff_multiplier: float = 2.0
    retryable: tuple[str, ...] = ("UNAVAILABLE", "RESOURCE_EXHAUSTED")
    # Wait (within the deadline) for an unreachable server instead of failing.
    wait_for_ready: bool = False
    # Longest wait between reconnection attempts (gRPC's default is 120 s,
    # which would leave a client idle long after a restarted server is back).
    max_reconnect_backoff_s: float = 1.0

    def __post_init__(self) -> None:
        # Below 2 ms, gRPC's retry timer can stall a call until its deadline
        # (grpc/grpc#41036); seen here with 1-1.5 ms backoffs.
        if self.initial_backoff_s < MIN_BACKOFF_S:
            raise ValueError(f"initial_backoff_s must be >= {MIN_BACKOFF_S} s")
        if self.max_backoff_s < self.initial_backoff_s:
            raise ValueError("max_backoff_s must be >= initial_backoff_s")
        if self.backoff_multiplier < 1:
            raise ValueError("backoff_multiplier must be >= 1")
        if self.max_reconnect_backoff_s < INITIAL_RECONNECT_BACKOFF_S:
            raise ValueError(f"max_reconnect_backoff_s must be >= {INITIAL_RECONNECT_BACKOFF_S} s")

    def service_config(self) -> str:
        policy = {
            "maxAttempts": self.max_attempts,
            "initialBackoff": f"{self.initial_backoff_s:.6f}s",
            "maxBackoff": f"{self.max_backoff_s:.6f}s",
            "backoffMultiplier": self.backoff_multiplier,
            "retryableStatusCodes": list(self.retryable),
        }
        return json.dumps({"methodConfig": [{"name": [{"service": ""}], "retryPolicy": policy}]})


class PlannerError(Exception):
    """A call that ended with a status other than OK."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class PlannerClient:
    def __init__(
        self,
        target: str | Sequence[str],
        deadline_s: float = DEFAULT_DEADLINE_S,
        retry: RetryPolicy | None = None,
        max_message_bytes: int = 64 * 1024 * 1024,
        *,
        tls: ClientTls | None = None,
        auth_token: str | None = None,
    ) -> None:
        """target: "host:port" (or a gRPC target URI), or several "host:port"
        replicas (a list, or comma-separated); ValueError (TargetError) when
        they cannot be used."""
        targets = split_targets(target)
        self.targets = targets
        self.target = ",".join(targets)
        self.deadline_s = deadline_s
        retry = retry or RetryPolicy()
        self._wait_for_ready = retry.wait_for_ready
        self._metadata = None if auth_token is None else bearer_metadata(auth_token)
        self._tls = tls
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.initial_reconnect_backoff_ms", round(INITIAL_RECONNECT_BACKOFF_S * 1e3)),
            ("grpc.max_reconnect_backoff_ms", round(retry.max_reconnect_backoff_s * 1e3)),
        ]
        if retry.max_attempts > 1:
            options += [("grpc.enable_retries", 1), ("grpc.service_config", retry.service_config())]
        else:
            # gRPC rejects a retry policy with maxAttempts < 2 and the channel
            # then fails every call; no retries means no retry policy.
            options.append(("grpc.enable_retries", 0))
        self.replicas: Replicas | None = None
        if len(targets) > 1:
            self.replicas = resolve(targets)
            # One authority (and TLS name) for every replica: the first target's.
            options.append(("grpc.default_authority", targets[0]))
            if tls is not None:
                options.append(("grpc.ssl_target_name_override", self.replicas.first_host))
        self._options = options
        self._lock = threading.Lock()
        if self.replicas is None:
            self._channel = self._open(targets[0], None)
        else:
            self._channel = self._open(self.replicas.channel_target(), "round_robin")
        # (first choice, second choice) -> a channel trying the replicas in
        # that key's order (pick_first), for calls with engine affinity.
        self._affine: dict[tuple[str, str], grpc.Channel] = {}
        self._stubs: dict[tuple[int, str], Any] = {}

    def _open(self, target: str, lb_policy: str | None) -> grpc.Channel:
        options = list(self._options)
        if lb_policy is not None:
            options.append(("grpc.lb_policy_name", lb_policy))
        if self._tls is None:
            return grpc.insecure_channel(target, options=options)
        return grpc.secure_channel(target, self._tls.credentials(), options=options)

    def channel_for(self, rpc: Rpc, request: Message) -> grpc.Channel:
        """The channel a call goes out on: the balanced one, or for a call
        with engine affinity, the one that prefers that engine's replica."""
        if self.replicas is None:
            return self._channel
        key = affinity_key(rpc, request)
        if key is None or len(self.replicas.addresses) < 2:
            return self._channel
        order = rendezvous_order(key, self.replicas.addresses)
        choice = (order[0], order[1])
        with self._lock:
            channel = self._affine.get(choice)
            if channel is None:
                # The first two choices name the channel; after them the
                # order is the first choice's own, so there are at most
                # n * (n - 1) such channels.
                rest = [a for a in rendezvous_order(order[0], order) if a not in choice]
                channel = self._open(self.replicas.channel_target([*choice, *rest]), "pick_first")
                self._affine[choice] = channel
            return channel

    def preferred_replica(self, method: str | Rpc, request: Message) -> str | None:
        """The address a call with engine affinity prefers (None: any)."""
        m = RPCS[method] if isinstance(method, str) else method
        key = affinity_key(m, request)
        if self.replicas is None or key is None:
            return None
        return rendezvous_order(key, self.replicas.addresses)[0]

    def _stub(self, m: Rpc, request: Message) -> Any:
        channel = self.channel_for(m, request)
        stub = self._stubs.get((id(channel), m.full_path))
        if stub is None:
            stub = channel.unary_unary(
                m.full_path,
                request_serializer=lambda msg: msg.SerializeToString(),
                response_deserializer=m.response_type.FromString,
            )
            self._stubs[(id(channel), m.full_path)] = stub
        return stub

    def call_future(
        self, method: str | Rpc, request: Message, deadline_s: float | None = None
    ) -> Future[Message]:
        """Starts Service.Method on this thread and returns at once: the
        future ends with the answer or a PlannerError, set on gRPC's own
        completion thread (no thread of the caller's waits for it)."""
        m = RPCS[method] if isinstance(method, str) else method
        out: Future[Message] = Future()
        out.set_running_or_notify_cancel()
        call = self._stub(m, request).future(
            request,
            timeout=self.deadline_s if deadline_s is None else deadline_s,
            metadata=self._metadata,
            wait_for_ready=self._wait_for_ready,
        )

        def ended(done: Any) -> None:
            try:
                out.set_result(done.result())
            except grpc.RpcError as exc:
                out.set_exception(PlannerError(exc.code(), exc.details() or ""))
            except grpc.FutureCancelledError:
                out.set_exception(PlannerError(grpc.StatusCode.CANCELLED, "cancelled"))

        call.add_done_callback(ended)
        return out

    def call(self, method: str | Rpc, request: Message, deadline_s: float | None = None) -> Message:
        """Call Service.Method; raises PlannerError on a non-OK status."""
        m = RPCS[method] if isinstance(method, str) else method
        stub = self._stub(m, request)
        try:
            response: Message = stub(
                request,
                timeout=self.deadline_s if deadline_s is None else deadline_s,
                metadata=self._metadata,
                wait_for_ready=self._wait_for_ready,
            )
        except grpc.RpcError as exc:
            raise PlannerError(exc.code(), exc.details() or "") from None
        return response

    def call_timed(
        self, method: str | Rpc, request: Message, deadline_s: float | None = None
    ) -> tuple[Message, ServerTiming | None]:
        """call(), asking the server for its moments (planner.call_timing):
        the answer and the server's moments (None when it sent none); raises
        PlannerError on a non-OK status."""
        m = RPCS[method] if isinstance(method, str) else method
        stub = self._stub(m, request)
        try:
            response, call = stub.with_call(
                request,
                timeout=self.deadline_s if deadline_s is None else deadline_s,
                metadata=(*(self._metadata or ()), (TIMING_KEY, "1")),
                wait_for_ready=self._wait_for_ready,
            )
        except grpc.RpcError as exc:
            raise PlannerError(exc.code(), exc.details() or "") from None
        timing = None
        for key, value in call.trailing_metadata() or ():
            if key == TIMING_KEY:
                timing = ServerTiming.parse(value)
        return response, timing

    def plan_rotation(
        self, request: rotation_pb2.PlanRotationRequest, deadline_s: float | None = None
    ) -> rotation_pb2.PlanRotationResponse:
        response = self.call("RotationService.PlanRotation", request, deadline_s)
        assert isinstance(response, rotation_pb2.PlanRotationResponse)
        return response

    def info(self, deadline_s: float | None = None) -> info_pb2.GetPlannerInfoResponse:
        response = self.call(
            "PlannerInfoService.GetPlannerInfo", info_pb2.GetPlannerInfoRequest(), deadline_s
        )
        assert isinstance(response, info_pb2.GetPlannerInfoResponse)
        return response

    def close(self) -> None:
        self._channel.close()
        with self._lock:
            affine = list(self._affine.values())
            self._affine.clear()
        for channel in affine:
            channel.close()

    def __enter__(self) -> PlannerClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
