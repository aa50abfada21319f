"""Per-call timing over real gRPC on loopback: the server's moments come back
in the trailing metadata when asked for, in order and inside the caller's own
window; the link's timing log gets one line per call, synchronous and
pipelined; a stuck planner's calls are logged with their status and no server
moments; the report cuts calls into parts and names the largest."""

from __future__ import annotations

import json
import time

import pytest
from planner.adapters.common.counters import FallbackReason
from planner.adapters.common.link import PlannerLink, PlanPipeline
from planner.adapters.common.snapshot import build_rotation_request

from planner.bench.call_timing_report import report
from planner.call_timing import CallTiming, ServerTiming
from planner.client import PlannerClient

NOW_S = 100.0
ROUND_TRIP_DEADLINE_S = 10.0


def _logged(path) -> list[CallTiming]:
    return [CallTiming.from_json(json.loads(line)) for line in path.read_text().splitlines()]


def test_server_moments_come_back_in_order_inside_the_callers_window(views, pools, planner_server):
    request = build_rotation_request(views, pools, NOW_S)
    with PlannerClient(planner_server.address, deadline_s=ROUND_TRIP_DEADLINE_S) as client:
        before = time.perf_counter_ns()
        response, timing = client.call_timed("RotationService.PlanRotation", request)
        after = time.perf_counter_ns()
        plain = client.call("RotationService.PlanRotation", request)
    assert timing is not None
    assert before <= timing.seen_ns <= timing.start_ns <= timing.end_ns <= after
    assert response == plain


def test_server_counts_the_thread_pool_hand_over(views, pools, planner_server):
    request = build_rotation_request(views, pools, NOW_S)
    labels = {
        "grpc_type": "unary",
        "grpc_service": "planner.v1.RotationService",
        "grpc_method": "PlanRotation",
    }
    queue = planner_server.metrics.registry.get_sample_value
    before = queue("planner_rpc_queue_seconds_count", labels) or 0.0
    with PlannerClient(planner_server.address, deadline_s=ROUND_TRIP_DEADLINE_S) as client:
        for _ in range(3):
            client.call("RotationService.PlanRotation", request)
    assert queue("planner_rpc_queue_seconds_count", labels) == before + 3


@pytest.mark.parametrize("pipelined", [False, True])
def test_timing_log_gets_one_line_per_call(views, pools, planner_server, tmp_path, pipelined):
    log = tmp_path / "calls.jsonl"
    request = build_rotation_request(views, pools, NOW_S)
    with PlannerLink(
        planner_server.address, deadline_s=ROUND_TRIP_DEADLINE_S, call_timing_log=str(log)
    ) as link:
        if pipelined:
            pipeline: PlanPipeline[None] = PlanPipeline(link, max_age_s=ROUND_TRIP_DEADLINE_S)
            for _ in range(3):
                assert pipeline.send(request, None)
                assert pipeline.take() is not None
        else:
            for _ in range(3):
                assert link.plan_rotation(request) is not None
    calls = _logged(log)
    assert len(calls) == 3
    for c in calls:
        assert c.code == "OK"
        assert c.server is not None
        assert c.handed_ns <= c.picked_ns <= c.server.seen_ns
        assert c.server.seen_ns <= c.server.start_ns <= c.server.end_ns <= c.returned_ns
        parts = c.parts_ms()
        rest = sum(v for k, v in parts.items() if k != "total")
        assert rest == pytest.approx(parts["total"])


def test_stuck_planner_calls_are_logged_with_their_status(views, pools, stuck_server, tmp_path):
    log = tmp_path / "calls.jsonl"
    with PlannerLink(stuck_server, deadline_s=0.005, call_timing_log=str(log)) as link:
        assert link.plan_rotation(build_rotation_request(views, pools, NOW_S)) is None
        assert link.counters.snapshot().fallbacks[FallbackReason.DEADLINE] == 1
    (call,) = _logged(log)
    assert call.code == "DEADLINE_EXCEEDED"
    assert call.server is None


def test_timing_log_needs_a_server():
    with pytest.raises(ValueError, match="call_timing_log needs a target"):
        PlannerLink(None, call_timing_log="calls.jsonl")


def _call(total_ms: float, largest: str) -> CallTiming:
    """A call of total_ms whose part `largest` takes all but 0.1 ms of each
    other part."""
    names = ("hand_over", "inbound", "server_queue", "handler", "outbound")
    ms = dict.fromkeys(names, 0.1)
    ms[largest] = total_ms - 0.1 * (len(names) - 1)
    t = [0]
    for name in names:
        t.append(t[-1] + round(ms[name] * 1e6))
    return CallTiming(t[0], t[1], t[5], ServerTiming(t[2], t[3], t[4]), "OK")


def test_report_names_the_largest_part_of_each_call_over_the_deadline():
    calls = [
        _call(1.0, "handler"),
        _call(6.0, "inbound"),
        _call(7.0, "inbound"),
        _call(9.0, "outbound"),
        _call(2.0, "server_queue"),
    ]
    r = report(calls, deadline_ms=5.0)
    assert (r.calls, r.timed, r.over) == (5, 5, 3)
    assert r.largest_over == {
        "hand_over": 0,
        "inbound": 2,
        "server_queue": 0,
        "handler": 0,
        "outbound": 1,
    }
    assert r.parts_over["total"].max_ms == pytest.approx(9.0)
    # Without its handler (0.1 ms each) every one of them is still over.
    assert r.over_without_handler == 3
    slow_handler = report([_call(6.0, "handler"), _call(5.5, "handler")], 5.0, 0.7)
    assert (slow_handler.over, slow_handler.over_without_handler) == (2, 0)
    # 0.7 ms less: 5.3 ms is still over, 4.8 ms is not.
    assert slow_handler.over_with_saving == 1
    assert r.parts["inbound"].max_ms == pytest.approx(6.6)
