"""OffloadLink: PlanLayerOffload and ReportStep in process and over real
gRPC on loopback give the same decisions, ReportStep feeds the engine's
adaptive controller, and a stuck, dead or refusing planner is a counted
fallback (None), never an exception."""

from __future__ import annotations

import pytest
from planner.adapters.common.counters import FallbackReason
from planner.adapters.common.offload_link import OffloadLink

from planner.policies.offload.search import warm_up
from planner.v1 import common_pb2, offload_pb2

ROUND_TRIP_DEADLINE_S = 10.0
LAYERS = 4
COMP_S = 0.001


@pytest.fixture(scope="module", autouse=True)
def offload_search_loaded() -> None:
    """The compiled search loaded before the in-process planner's first
    plan: in a fresh checkout that plan would compile it inside the
    deadline and fall back."""
    warm_up()


def _plan_request(engine_id: str = "") -> offload_pb2.PlanLayerOffloadRequest:
    """Three 60-token requests (4 blocks per layer, 48 one-layer blocks) on
    a 40-block budget: two of them must offload."""
    return offload_pb2.PlanLayerOffloadRequest(
        engine_id=engine_id,
        step=1,
        requests=[
            offload_pb2.DecodeRequest(id=f"r{i}", num_tokens=60, remaining_tokens=20)
            for i in range(3)
        ],
        layer_compute_s=[COMP_S] * LAYERS,
        link_blocks_per_s=2000.0,
        gpu_block_budget=40,
        block_size_tokens=16,
        slo=common_pb2.Slo(tbt_s=0.1),
    )


def _placements(response) -> list[tuple[str, list[int]]]:
    return [(p.id, list(p.offloaded_layers)) for p in response.plan.placements]


def test_in_process_and_grpc_plans_agree(planner_server):
    in_process = OffloadLink(None, ROUND_TRIP_DEADLINE_S)
    # A call made before the planner thread has loaded its handler falls back.
    assert in_process.wait_idle(ROUND_TRIP_DEADLINE_S)
    local = in_process.plan_layer_offload(_plan_request())
    with OffloadLink(planner_server.address, ROUND_TRIP_DEADLINE_S) as remote:
        over_grpc = remote.plan_layer_offload(_plan_request())
        assert remote.plan_counters.snapshot().ok == 1
    assert local is not None
    assert over_grpc is not None
    assert _placements(local) == _placements(over_grpc)
    assert sum(bool(layers) for _, layers in _placements(local)) == 2
    assert local.plan.window_steps == over_grpc.plan.window_steps


@pytest.mark.parametrize("remote", [False, True])
def test_report_step_refreshes_the_controller_by_ewma(planner_server, remote):
    engine_id = f"engine-{remote}"
    link = OffloadLink(planner_server.address if remote else None, ROUND_TRIP_DEADLINE_S)
    with link:
        plan = link.plan_layer_offload(_plan_request(engine_id))
        assert plan is not None
        observed = [0.003, 0.002, 0.001, 0.004]
        decision = link.report_step(
            offload_pb2.ReportStepRequest(
                engine_id=engine_id,
                step=1,
                observed_step_s=10 * plan.plan.predicted_step_s,
                batch_ids=["r0", "r1", "r2"],
                observed_layer_compute_s=observed,
            )
        )
    assert decision is not None
    assert decision.replan
    assert decision.reason == offload_pb2.REPLAN_REASON_PROFILE_MISMATCH
    assert list(decision.layer_compute_s) == [0.5 * COMP_S + 0.5 * o for o in observed]
    reports = link.report_counters.snapshot()
    assert (reports.calls, reports.ok, reports.total_fallbacks) == (1, 1, 0)


def test_stuck_planner_falls_back_at_the_deadline(stuck_offload_server):
    with OffloadLink(stuck_offload_server, deadline_s=0.005) as link:
        assert link.plan_layer_offload(_plan_request("e")) is None
        report = offload_pb2.ReportStepRequest(engine_id="e", step=1, observed_step_s=0.01)
        assert link.report_step(report) is None
    for counters in (link.plan_counters, link.report_counters):
        snap = counters.snapshot()
        assert snap.fallbacks[FallbackReason.DEADLINE] == 1
        assert (snap.calls, snap.ok) == (1, 0)


def test_dead_planner_falls_back_as_unavailable(dead_target):
    with OffloadLink(dead_target, deadline_s=1.0) as link:
        assert link.plan_layer_offload(_plan_request()) is None
    snap = link.plan_counters.snapshot()
    assert snap.fallbacks[FallbackReason.UNAVAILABLE] + snap.fallbacks[FallbackReason.DEADLINE] == 1
    assert snap.ok == 0


@pytest.mark.parametrize("target", [None, "server"])
def test_a_refused_request_is_an_error_fallback(planner_server, target):
    bad = _plan_request()
    bad.requests[0].num_tokens = 0
    link = OffloadLink(planner_server.address if target else None, ROUND_TRIP_DEADLINE_S)
    with link:
        assert link.plan_layer_offload(bad) is None
        # ReportStep must name the engine.
        assert link.report_step(offload_pb2.ReportStepRequest(observed_step_s=0.01)) is None
    assert link.plan_counters.snapshot().fallbacks[FallbackReason.ERROR] == 1
    assert link.report_counters.snapshot().fallbacks[FallbackReason.ERROR] == 1


def test_deadline_must_be_positive():
    with pytest.raises(ValueError, match="deadline_s"):
        OffloadLink(None, 0.0)
