"""OffloadService through a real gRPC server on loopback: a plan, the
controller's re-plan decisions over ReportStep, and bad input answered with
INVALID_ARGUMENT naming the field (the server keeps serving)."""

from __future__ import annotations

import grpc
import pytest

from planner.v1 import common_pb2, offload_pb2, offload_pb2_grpc, solver_pb2

LAYERS = 8


def request(**overrides) -> offload_pb2.PlanLayerOffloadRequest:
    msg = offload_pb2.PlanLayerOffloadRequest(
        engine_id="engine-a",
        step=5,
        requests=[
            offload_pb2.DecodeRequest(id="long", num_tokens=3000, deposited_tokens=2),
            offload_pb2.DecodeRequest(id="short", num_tokens=500),
        ],
        layer_compute_s=[0.002] * LAYERS,
        link_blocks_per_s=20_000,
        gpu_block_budget=1400,
        slo=common_pb2.Slo(tbt_s=0.1),
    )
    for key, value in overrides.items():
        setattr(msg, key, value)
    return msg


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> offload_pb2_grpc.OffloadServiceStub:
    return offload_pb2_grpc.OffloadServiceStub(channel)


def test_plan_fits_and_explains_itself(stub):
    plan = stub.PlanLayerOffload(request(), timeout=10).plan
    assert plan.source == offload_pb2.OFFLOAD_PLAN_SOURCE_SOLVER
    assert plan.gpu_blocks_used <= plan.gpu_block_budget == 1400
    # 3001 tokens -> 188 blocks per layer, 501 -> 32: 1760 blocks without offload.
    assert {p.id: p.blocks_per_layer for p in plan.placements} == {"long": 188, "short": 32}
    assert sum(len(p.offloaded_layers) for p in plan.placements) > 0
    assert plan.expiry_step == 5 + plan.window_steps
    assert plan.predicted_step_s >= 0.002 * LAYERS
    assert plan.solve.status in (
        solver_pb2.SOLVE_STATUS_OPTIMAL,
        solver_pb2.SOLVE_STATUS_FEASIBLE,
    )
    assert plan.summary


def test_report_step_asks_to_replan_on_batch_change_and_mismatch(stub):
    plan = stub.PlanLayerOffload(request(engine_id="engine-b"), timeout=10).plan
    same = offload_pb2.ReportStepRequest(
        engine_id="engine-b",
        step=5,
        observed_step_s=plan.predicted_step_s,
        batch_ids=["long", "short"],
    )
    ok = stub.ReportStep(same, timeout=10)
    assert not ok.replan and ok.reason == offload_pb2.REPLAN_REASON_NONE
    changed = offload_pb2.ReportStepRequest()
    changed.CopyFrom(same)
    del changed.batch_ids[:]
    changed.batch_ids.append("long")
    assert stub.ReportStep(changed, timeout=10).reason == offload_pb2.REPLAN_REASON_BATCH_CHANGE
    slow = offload_pb2.ReportStepRequest()
    slow.CopyFrom(same)
    slow.observed_step_s = plan.predicted_step_s * 2
    answer = stub.ReportStep(slow, timeout=10)
    assert answer.reason == offload_pb2.REPLAN_REASON_PROFILE_MISMATCH
    assert answer.layer_compute_s[0] > 0.002  # the EWMA moved towards the observation
    unknown = offload_pb2.ReportStepRequest(engine_id="nobody", step=1, observed_step_s=0.01)
    assert stub.ReportStep(unknown, timeout=10).reason == offload_pb2.REPLAN_REASON_NO_PLAN


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda m: m.requests.add(id="long", num_tokens=10), "requests[2].id"),
        (lambda m: setattr(m.requests[0], "num_tokens", 0), "requests[0].num_tokens"),
        (lambda m: setattr(m, "link_blocks_per_s", -1.0), "link_blocks_per_s"),
        (lambda m: m.layer_compute_s.__setitem__(3, float("nan")), "layer_compute_s[3]"),
        (lambda m: setattr(m.params, "min_window_steps", 0), "params.min_window_steps"),
        (lambda m: setattr(m.solver, "time_limit_s", 0.0), "solver.time_limit_s"),
        (lambda m: setattr(m.solver, "relative_gap", 1.0), "solver.relative_gap"),
        (lambda m: setattr(m.solver, "backend", 99), "solver.backend"),
        (lambda m: setattr(m, "gpu_block_budget", 0), "profile"),
    ],
)
def test_bad_input_names_the_field(stub, mutate, field):
    msg = request()
    mutate(msg)
    with pytest.raises(grpc.RpcError) as err:
        stub.PlanLayerOffload(msg, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(field)
    assert stub.PlanLayerOffload(request(), timeout=10).plan.placements


@pytest.mark.parametrize(
    ("backend", "reported"),
    [
        (common_pb2.SOLVER_BACKEND_UNSPECIFIED, common_pb2.SOLVER_BACKEND_BRANCH_AND_BOUND),
        (common_pb2.SOLVER_BACKEND_BRANCH_AND_BOUND, common_pb2.SOLVER_BACKEND_BRANCH_AND_BOUND),
        (common_pb2.SOLVER_BACKEND_CP_SAT, common_pb2.SOLVER_BACKEND_CP_SAT),
        (common_pb2.SOLVER_BACKEND_EXHAUSTIVE, common_pb2.SOLVER_BACKEND_EXHAUSTIVE),
    ],
)
def test_every_backend_gives_the_same_optimal_step(stub, backend, reported):
    msg = request(gpu_block_budget=1100)
    msg.solver.backend = backend
    msg.solver.time_limit_s = 5.0
    plan = stub.PlanLayerOffload(msg, timeout=30).plan
    assert plan.solve.backend == reported
    assert plan.solve.status == solver_pb2.SOLVE_STATUS_OPTIMAL
    reference = request(gpu_block_budget=1100)
    reference.solver.backend = common_pb2.SOLVER_BACKEND_EXHAUSTIVE
    expected = stub.PlanLayerOffload(reference, timeout=30).plan
    assert plan.solve.objective == pytest.approx(expected.solve.objective)
    assert [p.offloaded_layers for p in plan.placements] == [
        p.offloaded_layers for p in expected.placements
    ] or plan.predicted_step_s == pytest.approx(expected.predicted_step_s)
