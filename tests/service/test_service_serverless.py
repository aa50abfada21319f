"""ServerlessService (C2CServe) through a real gRPC server on loopback:
placement with solver stats, routing, chunk and kernel choice, the per-slice
rho tuners the service keeps, `planner call` in process, and bad input
answered with INVALID_ARGUMENT naming the field (the server keeps serving)."""

from __future__ import annotations

import json

import grpc
import pytest
from google.protobuf import json_format
from google.protobuf.message import Message

from planner import cli
from planner.v1 import common_pb2, serverless_pb2, serverless_pb2_grpc, solver_pb2

GB = 10**9
S = serverless_pb2


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> serverless_pb2_grpc.ServerlessServiceStub:
    return serverless_pb2_grpc.ServerlessServiceStub(channel)


def slices(profile: str = "gh200-3x24gb", n: int = 3) -> list[S.MigSliceSpec]:
    return [S.MigSliceSpec(id=f"s{i}", profile_name=profile) for i in range(n)]


def placement_request(**kw) -> S.PlanModelPlacementRequest:
    msg = S.PlanModelPlacementRequest(
        models=[
            S.ServerlessModelSpec(name="value", weight_bytes=30 * GB, tpot_s=0.1, weight=3.0),
            S.ServerlessModelSpec(name="x", weight_bytes=15 * GB, tpot_s=0.1, weight=2.0),
            S.ServerlessModelSpec(name="y", weight_bytes=15 * GB, tpot_s=0.1, weight=2.0),
            S.ServerlessModelSpec(name="llama-3-8b", tpot_s=0.5),  # weights from the profile
        ],
        slices=slices(n=2),
        link=S.C2cLink(link_gbps=405.0),
    )
    for key, value in kw.items():
        if isinstance(value, Message):
            getattr(msg, key).CopyFrom(value)
        else:
            setattr(msg, key, value)
    return msg


def test_placement_over_grpc_explains_itself(stub):
    answer = stub.PlanModelPlacement(placement_request(), timeout=30)
    assert answer.feasible
    assert answer.source == S.PLACEMENT_SOURCE_SOLVER
    assert {a.model for a in answer.assignments} == {"x", "y"}
    assert answer.link_demand_gbps == pytest.approx(300.0)
    assert answer.link_budget_gbps == pytest.approx(405.0 * 0.9)
    assert answer.served_weight == pytest.approx(4.0)
    assert answer.objective > answer.greedy_objective
    assert answer.solve.backend == common_pb2.SOLVER_BACKEND_CP_SAT
    assert answer.solve.status == solver_pb2.SOLVE_STATUS_OPTIMAL
    assert answer.solve.time_limit_s <= 0.2 + 1e-9
    unplaced = {u.model: u.reason for u in answer.unplaced}
    assert set(unplaced) == {"value", "llama-3-8b"}


def test_placement_greedy_method_skips_the_solver(stub):
    answer = stub.PlanModelPlacement(
        placement_request(method=S.PLACEMENT_METHOD_GREEDY), timeout=30
    )
    assert answer.source == S.PLACEMENT_SOURCE_GREEDY and not answer.HasField("solve")
    assert [a.model for a in answer.assignments] == ["value", "llama-3-8b"]


def test_route_over_grpc(stub):
    answer = stub.Route(
        S.RouteRequest(
            model=S.ServerlessModelSpec(name="m", weight_bytes=10 * GB, tpot_s=0.1),
            priority=2.0,
            slices=[
                S.SliceStatus(
                    slice=S.MigSliceSpec(id="a", profile_name="7"),
                    model="old",
                    model_c2c_gbps=300,
                    last_used_s=1.0,
                ),
                S.SliceStatus(slice=S.MigSliceSpec(id="b", profile_name="7")),
            ],
        ),
        timeout=10,
    )
    # The idle slice would overrun the link (300 + 100 > 364.5): evict.
    assert answer.action == S.ROUTE_ACTION_EVICT
    assert (answer.slice_id, answer.evicted_model) == ("a", "old")
    assert answer.link_demand_gbps == pytest.approx(100.0)


def test_route_preempts_and_shares_over_grpc(stub):
    slot = S.MigSliceSpec(id="a", profile_name="3")
    busy = S.SliceStatus(
        slice=slot,
        model="old",
        model_c2c_gbps=100,
        model_priority=1.0,
        in_flight=2,
        active_since_s=0.0,
        slack_s=12.0,
    )
    model = S.ServerlessModelSpec(name="m", weight_bytes=10 * GB, tpot_s=0.1)
    preemption = S.Preemption(
        min_hold_s=2.0, urgent_slack_s=1.0, victim_slack_s=10.0, starve_after_s=30.0
    )
    # Urgent (0.5 s of slack) and the victim, ready for 5 s, has 12 s: preempt.
    answer = stub.Route(
        S.RouteRequest(
            model=model, priority=1.0, slices=[busy], now_s=5.0, slack_s=0.5, preemption=preemption
        ),
        timeout=10,
    )
    assert answer.action == S.ROUTE_ACTION_EVICT
    assert (answer.evicted_model, answer.preempts, answer.eviction) == ("old", True, "held")
    # Two models per slice: share it instead (100 + 100 within 364.5 GB/s).
    answer = stub.Route(
        S.RouteRequest(
            model=model,
            priority=1.0,
            slices=[busy],
            now_s=5.0,
            slack_s=0.5,
            preemption=preemption,
            max_models_per_slice=2,
        ),
        timeout=10,
    )
    assert (answer.action, answer.slice_id) == (S.ROUTE_ACTION_SHARE, "a")


def test_schedule_waiting_over_grpc(stub):
    slot = S.MigSliceSpec(id="a", profile_name="3")
    answer = stub.ScheduleWaiting(
        S.ScheduleWaitingRequest(
            waiting=[
                S.WaitingModelSpec(
                    model=S.ServerlessModelSpec(name=name, weight_bytes=10 * GB, tpot_s=0.1),
                    priority=1.0,
                    waiting_since_s=since,
                    requests=1,
                    slack_s=slack,
                )
                for name, since, slack in (("calm", 1.0, 4.0), ("urgent", 2.0, 0.2))
            ],
            slices=[
                S.SliceStatus(
                    slice=slot,
                    model="old",
                    model_c2c_gbps=100,
                    model_priority=1.0,
                    in_flight=1,
                    active_since_s=0.0,
                    slack_s=20.0,
                )
            ],
            now_s=5.0,
            preemption=S.Preemption(
                min_hold_s=2.0, urgent_slack_s=1.0, victim_slack_s=10.0, starve_after_s=30.0
            ),
        ),
        timeout=10,
    )
    # Least slack first: urgent takes the slice, calm (not urgent) queues.
    got = [(r.model, r.decision.action) for r in answer.routes]
    assert got == [("urgent", S.ROUTE_ACTION_EVICT), ("calm", S.ROUTE_ACTION_QUEUE)]


def test_chunk_size_derived_and_given(stub):
    derived = stub.ChooseChunkSize(
        S.ChooseChunkSizeRequest(
            model_name="llama-3-8b",
            slice=S.MigSliceSpec(id="a", profile_name="gh200-7x12gb"),
            ttft_target_s=2.0,
            prompt_tokens=2048,
            c2c_gbps=58.0,
        ),
        timeout=10,
    )
    assert derived.meets_target and derived.ttft_s <= 2.0
    assert [r.chunk_tokens for r in derived.table] == [128, 256, 512, 1024, 2048, 4096, 8192]
    assert derived.chunk_tokens == min(r.chunk_tokens for r in derived.table if r.ttft_s <= 2.0)
    given = stub.ChooseChunkSize(
        S.ChooseChunkSizeRequest(
            slice=S.MigSliceSpec(id="a", profile_name="7"),
            ttft_target_s=1.0,
            table=[
                S.ChunkProfileRow(chunk_tokens=512, ttft_s=1.5),
                S.ChunkProfileRow(chunk_tokens=1024, ttft_s=1.0),
            ],
        ),
        timeout=10,
    )
    assert (given.chunk_tokens, given.meets_target) == (1024, True)


def feedback(slice_id: str, t: float, hbm: float, c2c: float, **kw) -> S.ReportKnobFeedbackRequest:
    return S.ReportKnobFeedbackRequest(
        gpu_id="gpu0",
        slice_id=slice_id,
        now_s=t,
        latency_s=0.01,
        latency_budget_s=0.02,
        hbm_util=hbm,
        c2c_util=c2c,
        **kw,
    )


def test_one_tuner_per_slice_kept_by_the_service(stub):
    kernel = stub.ChooseKernel(
        S.ChooseKernelRequest(
            tokens=2048,
            slice=S.MigSliceSpec(id="t0", profile_name="3"),
            model_name="llama-3-8b",
            gpu_id="gpu0",
        ),
        timeout=10,
    )
    assert kernel.initial_rho == 0.0 and kernel.shape == "prefill"
    assert kernel.family.startswith("hybrid_gemm.bf16.prefill")
    # HBM saturated on t0: rho climbs across calls; C2C saturated on t1.
    rhos = [stub.ReportKnobFeedback(feedback("t0", t, 1.0, 0.2), timeout=10).rho for t in range(3)]
    assert rhos == pytest.approx([0.02, 0.04, 0.06])
    other = stub.ReportKnobFeedback(feedback("t1", 0, 0.2, 1.0), timeout=10)
    assert other.rho == 0.0 and "clamped" in other.reason
    # Mid-layer reports smooth but never move rho.
    held = stub.ReportKnobFeedback(feedback("t0", 3, 1.0, 0.2, mid_layer=True), timeout=10)
    assert held.rho == pytest.approx(0.06) and not held.changed
    state = stub.GetKnobState(S.GetKnobStateRequest(gpu_id="gpu0"), timeout=10)
    by_slice = {k.slice_id: k.state for k in state.slices}
    assert by_slice["t0"].rho == pytest.approx(0.06) and by_slice["t0"].samples == 4
    assert by_slice["t1"].rho == 0.0
    # A model switch (ChooseKernel with gpu_id) restarts the slice's tuner at 0.
    stub.ChooseKernel(
        S.ChooseKernelRequest(
            tokens=8, slice=S.MigSliceSpec(id="t0", profile_name="3"), gpu_id="gpu0"
        ),
        timeout=10,
    )
    state = stub.GetKnobState(S.GetKnobStateRequest(gpu_id="gpu0"), timeout=10)
    assert {k.slice_id: k.state.rho for k in state.slices}["t0"] == 0.0
    # Parameters sent with a report replace the tuner's.
    big = stub.ReportKnobFeedback(
        feedback("t0", 10, 1.0, 0.0, params=S.KnobTunerParams(step_small=0.1)), timeout=10
    )
    assert big.rho == pytest.approx(0.1)


BAD = [
    ("PlanModelPlacement", S.PlanModelPlacementRequest(models=[], slices=[]), "slices"),
    (
        "PlanModelPlacement",
        placement_request(link=S.C2cLink(utilization_cap=1.5)),
        "link.utilization_cap",
    ),
    (
        "PlanModelPlacement",
        S.PlanModelPlacementRequest(
            models=[S.ServerlessModelSpec(name="a", weight_bytes=GB, tpot_s=0.0)],
            slices=slices(n=1),
        ),
        "models[0].tpot_s",
    ),
    (
        "PlanModelPlacement",
        S.PlanModelPlacementRequest(
            models=[
                S.ServerlessModelSpec(name="a", weight_bytes=GB, tpot_s=0.1),
                S.ServerlessModelSpec(name="a", weight_bytes=GB, tpot_s=0.1),
            ],
            slices=slices(n=1),
        ),
        "models[1].name",
    ),
    (
        "PlanModelPlacement",
        S.PlanModelPlacementRequest(
            models=[S.ServerlessModelSpec(name="mystery", tpot_s=0.1)], slices=slices(n=1)
        ),
        "models[0].weight_bytes",
    ),
    (
        "PlanModelPlacement",
        S.PlanModelPlacementRequest(
            models=[S.ServerlessModelSpec(name="a", weight_bytes=GB, tpot_s=0.1)],
            slices=[S.MigSliceSpec(id="x", profile_name="5x9gb")],
        ),
        "slices[0].profile_name",
    ),
    (
        "PlanModelPlacement",
        S.PlanModelPlacementRequest(
            models=[S.ServerlessModelSpec(name="a", weight_bytes=GB, tpot_s=0.1)],
            slices=[S.MigSliceSpec(id="x", sms=16, hbm_bytes=GB, hbm_gbps=-1)],
        ),
        "slices[0].hbm_gbps",
    ),
    (
        "PlanModelPlacement",
        placement_request(solver=solver_pb2.SolverOptions(time_limit_s=-1)),
        "solver.time_limit_s",
    ),
    (
        "Route",
        S.RouteRequest(
            model=S.ServerlessModelSpec(name="m", weight_bytes=GB, tpot_s=0.1),
            slices=[S.SliceStatus(slice=S.MigSliceSpec(id="a", profile_name="7"), in_flight=-1)],
        ),
        "slices[0].in_flight",
    ),
    (
        "Route",
        S.RouteRequest(model=S.ServerlessModelSpec(name="m", weight_bytes=GB, tpot_s=0.1)),
        "slices",
    ),
    (
        "Route",
        S.RouteRequest(
            model=S.ServerlessModelSpec(name="m", weight_bytes=GB, tpot_s=0.1),
            slices=[
                S.SliceStatus(slice=S.MigSliceSpec(id="a", profile_name="7"), model="x"),
                S.SliceStatus(slice=S.MigSliceSpec(id="a", profile_name="7"), model="y"),
            ],
        ),
        "slices",
    ),
    (
        "Route",
        S.RouteRequest(
            model=S.ServerlessModelSpec(name="m", weight_bytes=GB, tpot_s=0.1),
            slices=[S.SliceStatus(slice=S.MigSliceSpec(id="a", profile_name="7"))],
            preemption=S.Preemption(min_hold_s=-1.0),
        ),
        "preemption.min_hold_s",
    ),
    (
        "ScheduleWaiting",
        S.ScheduleWaitingRequest(
            waiting=[
                S.WaitingModelSpec(
                    model=S.ServerlessModelSpec(name="m", weight_bytes=GB, tpot_s=0.1),
                    requests=0,
                )
            ],
            slices=[S.SliceStatus(slice=S.MigSliceSpec(id="a", profile_name="7"))],
        ),
        "waiting[0].requests",
    ),
    (
        "ScheduleWaiting",
        S.ScheduleWaitingRequest(
            waiting=[
                S.WaitingModelSpec(
                    model=S.ServerlessModelSpec(name="m", weight_bytes=GB, tpot_s=0.1),
                    requests=1,
                    waiting_since_s=9.0,
                )
            ],
            slices=[S.SliceStatus(slice=S.MigSliceSpec(id="a", profile_name="7"))],
            now_s=1.0,
        ),
        "waiting[0].waiting_since_s",
    ),
    (
        "ChooseChunkSize",
        S.ChooseChunkSizeRequest(
            model_name="llama-3-8b", slice=S.MigSliceSpec(profile_name="7"), ttft_target_s=1.0
        ),
        "prompt_tokens",
    ),
    (
        "ChooseChunkSize",
        S.ChooseChunkSizeRequest(
            slice=S.MigSliceSpec(profile_name="7"),
            ttft_target_s=1.0,
            table=[S.ChunkProfileRow(chunk_tokens=64, ttft_s=0.0)],
        ),
        "table[0].ttft_s",
    ),
    (
        "ChooseChunkSize",
        S.ChooseChunkSizeRequest(slice=S.MigSliceSpec(profile_name="7"), ttft_target_s=0),
        "ttft_target_s",
    ),
    (
        "ChooseKernel",
        S.ChooseKernelRequest(precision="int4", tokens=8, slice=S.MigSliceSpec(profile_name="7")),
        "precision",
    ),
    (
        "ChooseKernel",
        S.ChooseKernelRequest(tokens=0, slice=S.MigSliceSpec(profile_name="7")),
        "tokens",
    ),
    ("ReportKnobFeedback", feedback("", 0, 0.5, 0.5), "slice_id"),
    ("ReportKnobFeedback", feedback("s", 0, 2.0, 0.5), "hbm_util"),
    (
        "ReportKnobFeedback",
        S.ReportKnobFeedbackRequest(gpu_id="g", slice_id="s", latency_s=0.1, hbm_util=0.5),
        "latency_budget_s",
    ),
    (
        "ReportKnobFeedback",
        feedback("s", 0, 0.5, 0.5, params=S.KnobTunerParams(rho_min=0.9, rho_max=0.1)),
        "params.rho_max",
    ),
    ("GetKnobState", S.GetKnobStateRequest(), "gpu_id"),
]


@pytest.mark.parametrize(("method", "request_msg", "field"), BAD, ids=[b[2] for b in BAD])
def test_bad_input_is_invalid_argument_naming_the_field(stub, method, request_msg, field):
    with pytest.raises(grpc.RpcError) as err:
        getattr(stub, method)(request_msg, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(f"{field}:"), err.value.details()


def test_server_still_serves_after_bad_input(stub):
    test_placement_greedy_method_skips_the_solver(stub)


def test_planner_call_in_process(tmp_path, capsys):
    path = tmp_path / "req.json"
    path.write_text(json_format.MessageToJson(placement_request()), encoding="utf-8")
    code = cli.main(["call", "ServerlessService.PlanModelPlacement", "--json", str(path)])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["source"] == "PLACEMENT_SOURCE_SOLVER"
    assert {a["model"] for a in out["assignments"]} == {"x", "y"}
