"""Round trips through a real planner server on loopback: plans, info,
health, reflection."""

from __future__ import annotations

import threading

import grpc
import pytest
from google.protobuf import descriptor_pool, json_format, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from held_call import held_call
from planner.solvers import Backend, available_backends

import planner
from planner.client import PlannerClient, RetryPolicy
from planner.profiles import HARDWARE_PROFILES, MODEL_PROFILES
from planner.replay.policy_registries import served_policies
from planner.rpc import RPCS
from planner.service.limits import ServiceLimits
from planner.service.methods import CallContext, handle
from planner.v1 import common_pb2, info_pb2, rotation_pb2

PLAN = "RotationService.PlanRotation"
INFO = "PlannerInfoService.GetPlannerInfo"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def assert_example_plan(response: rotation_pb2.PlanRotationResponse) -> None:
    plan = response.plan
    assert plan.fcfs_fallback is False
    assert [d.id for d in plan.prioritized] == ["a", "c"]
    assert [d.state for d in plan.prioritized] == [common_pb2.WAITING, common_pb2.ROTARY]
    # a: relu(10 - 2 - 0.5 * 5) = 5.5; c: 3 * relu(10 - 9.7 - 0) = 0.9.
    assert [d.vlt for d in plan.prioritized] == pytest.approx([5.5, 0.9])
    # A WAITING request needs its prompt blocks + 1 for the first decode.
    assert [d.blocks for d in plan.prioritized] == [31, 25]
    assert [d.id for d in plan.preempted] == ["b"]
    assert plan.preempted[0].state == common_pb2.RUNNING
    assert plan.preempted[0].vlt == pytest.approx(-9.0)
    assert plan.preempted[0].blocks == 60
    e = plan.explanation
    assert e.variant == rotation_pb2.ROTATION_VARIANT_LVF
    assert e.transfer_budget_blocks == e.d2h_budget_blocks == 50
    assert e.budget_source == rotation_pb2.BUDGET_SOURCE_GIVEN
    assert e.free_gpu_blocks == 40
    assert e.blocks_needed == 56
    # b's TPOT slack (1.5 + 0.1 x 300 - 10 = 21.5 s) is over 160 TBT SLOs
    # (16 s); c's (5 + 0.1 x 40 - 10 = -1 s) is down to 10 SLOs and not yet
    # lost, so c displaces b. c lands in b's 50 SYNCED blocks, released at
    # once; b's other 10 are copied out (charged to the D2H budget) and free
    # after the copy: 40 + 50 + 10 - 31 - 25 = 44 left.
    assert e.swap_blocks_needed == 60
    assert e.blocks_left == 44
    assert (e.swap_in_blocks, e.swap_out_blocks, e.blocks_released_now) == (25, 10, 50)
    assert (e.held_engine_full, e.held_link_full, e.held_not_lagging, e.held_no_victim) == (
        0,
        0,
        0,
        0,
    )


def test_example_request_round_trip(channel, stub, example_request):
    response = stub(channel, PLAN)(example_request, timeout=10)
    assert isinstance(response, rotation_pb2.PlanRotationResponse)
    assert_example_plan(response)


def test_server_answers_the_same_bytes_as_in_process_handle(channel, stub, example_request):
    wire = stub(channel, PLAN, raw=True)(example_request.SerializeToString(), timeout=10)
    local = handle(RPCS[PLAN], example_request, CallContext(ServiceLimits()))
    assert wire == local.SerializeToString()
    assert_example_plan(rotation_pb2.PlanRotationResponse.FromString(wire))


def test_client_round_trip(server, example_request):
    with PlannerClient(server.address, deadline_s=10) as client:
        assert_example_plan(client.plan_rotation(example_request))
        assert client.info().version == planner.__version__


def test_concurrent_calls_all_get_the_same_plan(channel, stub, example_request):
    call = stub(channel, PLAN, raw=True)
    data = example_request.SerializeToString()
    expected = handle(RPCS[PLAN], example_request, CallContext(ServiceLimits()))
    pending = [call.future(data, timeout=30) for _ in range(32)]
    answers = {f.result() for f in pending}
    assert answers == {expected.SerializeToString()}


def test_planner_info(server, channel, stub):
    info = stub(channel, INFO)(info_pb2.GetPlannerInfoRequest(), timeout=10)
    assert info.version == planner.__version__
    assert list(info.services) == [
        "planner.v1.ClusterService",
        "planner.v1.OffloadService",
        "planner.v1.PlacementService",
        "planner.v1.PlannerInfoService",
        "planner.v1.RotationService",
        "planner.v1.ServerlessService",
    ]
    assert "rotation/lvf" in info.policies and "offload/orbitflow" in info.policies
    assert tuple(info.policies) == served_policies()
    assert [common_pb2.SolverBackend.Name(b) for b in info.solver_backends] == [
        f"SOLVER_BACKEND_{'CP_SAT' if b is Backend.CPSAT else b.name}" for b in available_backends()
    ]
    assert list(info.model_profiles) == sorted(MODEL_PROFILES)
    assert list(info.hardware_profiles) == sorted(HARDWARE_PROFILES)
    assert "llama-3-8b" in info.model_profiles
    assert info.max_requests_per_snapshot == server.config.limits.max_requests_per_snapshot
    assert info.max_message_bytes == server.config.limits.max_message_bytes
    assert common_pb2.SOLVER_BACKEND_UNSPECIFIED not in info.solver_backends
    # OR-Tools is a dependency; exhaustive enumeration needs nothing.
    assert common_pb2.SOLVER_BACKEND_CP_SAT in info.solver_backends
    assert common_pb2.SOLVER_BACKEND_EXHAUSTIVE in info.solver_backends


def test_planner_info_reports_configured_limits(start_server, stub):
    limits = ServiceLimits(max_requests_per_snapshot=7, max_message_bytes=123_456)
    server = start_server(limits)
    with grpc.insecure_channel(server.address) as ch:
        info = stub(ch, INFO)(info_pb2.GetPlannerInfoRequest(), timeout=10)
    assert info.max_requests_per_snapshot == 7
    assert info.max_message_bytes == 123_456


# --- health -----------------------------------------------------------------


@pytest.mark.parametrize(
    "service", ["", "planner.v1.RotationService", "planner.v1.PlannerInfoService"]
)
def test_health_serving(channel, service):
    health = health_pb2_grpc.HealthStub(channel)
    response = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
    assert response.status == SERVING


def test_health_unknown_service_is_not_found(channel):
    health = health_pb2_grpc.HealthStub(channel)
    with pytest.raises(grpc.RpcError) as err:
        health.Check(health_pb2.HealthCheckRequest(service="planner.v1.NoSuchService"), timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("service", ["", "planner.v1.RotationService"])
def test_health_turns_not_serving_when_stop_begins(start_server, service):
    server = start_server()
    with grpc.insecure_channel(server.address) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        watch = health.Watch(health_pb2.HealthCheckRequest(service=service), timeout=30)
        assert next(watch).status == SERVING
        stopper = threading.Thread(target=server.stop, kwargs={"grace_s": 30.0})
        stopper.start()
        # The watch is a call in flight: the server tells it NOT_SERVING at
        # the start of the grace period.
        assert next(watch).status == NOT_SERVING
        watch.cancel()
        stopper.join(timeout=30)
        assert not stopper.is_alive(), "stop() returned once the last call ended"
        with pytest.raises(grpc.RpcError) as err:
            health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_server_refuses_calls_beyond_max_concurrent_rpcs(start_server, stub, example_request):
    server = start_server(ServiceLimits(max_concurrent_rpcs=1))
    # A reflection stream held open by the client occupies the one slot.
    with held_call(server.address) as (ch, _):
        with pytest.raises(grpc.RpcError) as err:
            stub(ch, PLAN)(example_request, timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # RESOURCE_EXHAUSTED is retryable: the client gets through once the slot
    # is free again.
    retry = RetryPolicy(max_attempts=5, initial_backoff_s=0.01, max_backoff_s=0.2)
    with PlannerClient(server.address, deadline_s=10, retry=retry) as client:
        assert_example_plan(client.plan_rotation(example_request))


# --- reflection ---------------------------------------------------------------


def test_reflection_lists_services_and_resolves_methods(channel):
    db = ProtoReflectionDescriptorDatabase(channel)
    services = set(db.get_services())
    assert {
        "planner.v1.RotationService",
        "planner.v1.PlannerInfoService",
        "grpc.health.v1.Health",
    } <= services
    pool = descriptor_pool.DescriptorPool(db)
    method = pool.FindServiceByName("planner.v1.RotationService").FindMethodByName("PlanRotation")
    assert method.input_type.full_name == "planner.v1.PlanRotationRequest"
    assert method.output_type.full_name == "planner.v1.PlanRotationResponse"
    info = pool.FindServiceByName("planner.v1.PlannerInfoService").FindMethodByName(
        "GetPlannerInfo"
    )
    assert info.output_type.full_name == "planner.v1.GetPlannerInfoResponse"
    # Message types resolve with their fields, down to the shared ones.
    snapshot = pool.FindMessageTypeByName("planner.v1.Snapshot")
    assert snapshot.fields_by_name["requests"].message_type.full_name == (
        "planner.v1.TrackedRequest"
    )


def test_reflection_alone_is_enough_to_call_plan_rotation(channel, stub, example_request):
    """What grpcurl does: JSON -> bytes with reflected descriptors, call, decode."""
    pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
    method = pool.FindServiceByName("planner.v1.RotationService").FindMethodByName("PlanRotation")
    request_cls = message_factory.GetMessageClass(method.input_type)
    response_cls = message_factory.GetMessageClass(method.output_type)
    request = json_format.ParseDict(json_format.MessageToDict(example_request), request_cls())
    wire = stub(channel, PLAN, raw=True)(request.SerializeToString(), timeout=10)
    reflected = json_format.MessageToDict(response_cls.FromString(wire))
    compiled = json_format.MessageToDict(rotation_pb2.PlanRotationResponse.FromString(wire))
    assert reflected == compiled
    assert [d["id"] for d in reflected["plan"]["prioritized"]] == ["a", "c"]


def test_columns_give_the_same_plan_as_rows(channel, stub, example_request, example_columns):
    assert len(example_columns.snapshot.requests) == 0
    assert list(example_columns.snapshot.columns.id) == ["a", "b", "c"]
    call = stub(channel, PLAN, raw=True)
    rows = call(example_request.SerializeToString(), timeout=10)
    columns = call(example_columns.SerializeToString(), timeout=10)
    assert columns == rows
    assert_example_plan(rotation_pb2.PlanRotationResponse.FromString(columns))
