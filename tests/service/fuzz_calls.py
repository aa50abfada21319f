"""What the fuzz tests assert about one call to a real server: it ends with
a status a client can act on (never INTERNAL or UNKNOWN) within its
deadline, a refusal names the field, a refused call changes no stored
state, and the server still answers valid calls afterwards."""

from __future__ import annotations

import re
from collections.abc import Callable

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from valid_requests import CLUSTER, GPU, POOL, VALID

from planner.rpc import RPCS
from planner.v1 import cluster_pb2, placement_pb2, serverless_pb2

DEADLINE_S = 10.0
# Reading stored state back may wait out work that a fuzzed call left
# running on the server after its own deadline (gRPC does not stop a
# handler whose caller gave up): on a loaded machine, longer than 10 s.
STATE_DEADLINE_S = 60.0
ANSWERED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}
# "<field path>: <reason>", e.g. "snapshot.requests[2].id: duplicate id 'a'".
FIELD_DETAIL = re.compile(r"^[A-Za-z_][\w.\[\]]*: \S")


def _identity(data: bytes) -> bytes:
    return data


def call_raw(channel: grpc.Channel, method: str, data: bytes) -> tuple[grpc.StatusCode, str]:
    """Send bytes as the request of Service.Method; the status and details."""
    multi = channel.unary_unary(
        RPCS[method].full_path, request_serializer=_identity, response_deserializer=_identity
    )
    try:
        answer = multi(data, timeout=DEADLINE_S)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    RPCS[method].response_type.FromString(answer)  # a well-formed response
    return grpc.StatusCode.OK, ""


def call(channel: grpc.Channel, method: str, request: Message) -> tuple[grpc.StatusCode, str]:
    return call_raw(channel, method, request.SerializeToString())


def assert_answered(code: grpc.StatusCode, detail: str) -> None:
    assert code in ANSWERED, f"{code.name}: {detail}"
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        assert FIELD_DETAIL.match(detail), f"INVALID_ARGUMENT does not name a field: {detail!r}"


def _state_readers() -> dict[str, Callable[[grpc.Channel], bytes]]:
    def read(method: str, request: Message) -> Callable[[grpc.Channel], bytes]:
        def state(channel: grpc.Channel) -> bytes:
            multi = channel.unary_unary(
                RPCS[method].full_path,
                request_serializer=lambda m: m.SerializeToString(deterministic=True),
                response_deserializer=_identity,
            )
            return bytes(multi(request, timeout=STATE_DEADLINE_S))

        return state

    pool = read(
        "PlacementService.GetPoolStatus", placement_pb2.GetPoolStatusRequest(pool_id=POOL, now_s=3)
    )
    cluster = read(
        "ClusterService.GetClusterState", cluster_pb2.GetClusterStateRequest(cluster_id=CLUSTER)
    )
    knobs = read("ServerlessService.GetKnobState", serverless_pb2.GetKnobStateRequest(gpu_id=GPU))
    by_service = {"PlacementService": pool, "ClusterService": cluster, "ServerlessService": knobs}
    return {
        name: by_service[rpc.service] for name, rpc in RPCS.items() if rpc.service in by_service
    }


STATE_OF = _state_readers()
"""Service.Method -> the stored state a call of it may change, as bytes."""


def assert_call_answered(channel: grpc.Channel, method: str, data: bytes) -> grpc.StatusCode:
    """One fuzzed call: answered with a status; refused ones change nothing."""
    read_state = STATE_OF.get(method)
    before = read_state(channel) if read_state else b""
    code, detail = call_raw(channel, method, data)
    assert_answered(code, detail)
    if read_state and code != grpc.StatusCode.OK:
        assert read_state(channel) == before, f"refused {method} ({detail}) changed state"
    return code


def _fresh_ids(request: Message, suffix: str) -> Message:
    for name in ("pool_id", "cluster_id", "engine_id", "gpu_id"):
        if name in request.DESCRIPTOR.fields_by_name:
            setattr(request, name, f"{getattr(request, name)}-{suffix}")
    return request


def assert_serving(channel: grpc.Channel, suffix: str) -> None:
    """Health says SERVING and every RPC answers its valid request with OK
    (stateful ones on ids of their own, in an order that makes each valid)."""
    health = health_pb2_grpc.HealthStub(channel)
    answer = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=DEADLINE_S)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    for method, build in VALID.items():
        code, detail = call(channel, method, _fresh_ids(build(), suffix))
        assert code == grpc.StatusCode.OK, f"{method} after fuzzing: {code.name}: {detail}"
