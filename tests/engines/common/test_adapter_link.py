"""PlannerLink: the same plan in process and over real gRPC on loopback, and
a fallback (None, counted by reason) when the planner is dead, stuck, or
answers with an error."""

from __future__ import annotations

import sys
import threading

import pytest
from planner.adapters.common.channel import CALL_SWITCH_INTERVAL_S, short_gil_switch_interval
from planner.adapters.common.counters import FallbackCounters, FallbackReason
from planner.adapters.common.link import PlannerLink, PlanPipeline
from planner.adapters.common.snapshot import build_rotation_request
from prometheus_client import CollectorRegistry

import planner.in_process.service as in_process_service
from planner.v1 import common_pb2

NOW_S = 100.0
# Generous: these tests check what comes back, not how fast; the stuck and
# dead cases end at the deadline whatever it is.
ROUND_TRIP_DEADLINE_S = 10.0


def _ids(decisions) -> list[str]:
    return [d.id for d in decisions]


def _loaded(link: PlannerLink) -> PlannerLink:
    """The link once its in-process planner thread has loaded its handler: a
    call made before that falls back at once, which these tests are not about."""
    assert link.wait_idle(ROUND_TRIP_DEADLINE_S)
    return link


def test_in_process_plan_rotates_the_waiting_request_in(views, pools):
    link = _loaded(PlannerLink(None, deadline_s=ROUND_TRIP_DEADLINE_S))
    response = link.plan_rotation(build_rotation_request(views, pools, NOW_S))
    assert response is not None
    assert not response.plan.fcfs_fallback
    assert _ids(response.plan.prioritized) == ["w-late"]
    assert _ids(response.plan.preempted) == ["r-old"]
    snap = link.counters.snapshot()
    assert (snap.calls, snap.ok, snap.total_fallbacks) == (1, 1, 0)
    assert snap.latency.count == 1


def test_grpc_answer_equals_in_process_answer(views, pools, planner_server):
    request = build_rotation_request(views, pools, NOW_S)
    with PlannerLink(planner_server.address, deadline_s=ROUND_TRIP_DEADLINE_S) as remote:
        over_grpc = remote.plan_rotation(request)
        assert remote.counters.snapshot().ok == 1
    local = _loaded(PlannerLink(None, deadline_s=ROUND_TRIP_DEADLINE_S)).plan_rotation(request)
    assert over_grpc is not None
    assert over_grpc == local


def test_stuck_planner_falls_back_at_the_deadline(views, pools, stuck_server):
    with PlannerLink(stuck_server, deadline_s=0.005) as link:
        assert link.plan_rotation(build_rotation_request(views, pools, NOW_S)) is None
        snap = link.counters.snapshot()
    assert snap.fallbacks[FallbackReason.DEADLINE] == 1
    assert (snap.calls, snap.ok) == (1, 0)


def test_an_unknown_pipelined_send_is_refused():
    with pytest.raises(ValueError, match="pipelined_send"):
        PlannerLink("127.0.0.1:1", pipelined_send="carrier-pigeon")


def test_dead_planner_falls_back_as_unavailable(views, pools, dead_target):
    with PlannerLink(dead_target, deadline_s=1.0) as link:
        for _ in range(3):
            assert link.plan_rotation(build_rotation_request(views, pools, NOW_S)) is None
        snap = link.counters.snapshot()
    # Refused at once, or (while the channel backs off) out of time.
    refused = snap.fallbacks[FallbackReason.UNAVAILABLE] + snap.fallbacks[FallbackReason.DEADLINE]
    assert refused == 3
    assert snap.fallbacks[FallbackReason.UNAVAILABLE] >= 1
    assert snap.ok == 0


@pytest.mark.parametrize("remote", [False, True], ids=["in-process", "grpc"])
def test_rejected_request_falls_back_as_error(views, pools, planner_server, remote):
    request = build_rotation_request(views, pools, NOW_S)
    request.snapshot.columns.id[1] = request.snapshot.columns.id[0]  # duplicate id
    target = planner_server.address if remote else None
    with PlannerLink(target, deadline_s=ROUND_TRIP_DEADLINE_S) as link:
        assert link.plan_rotation(request) is None
        assert link.counters.snapshot().fallbacks[FallbackReason.ERROR] == 1


def test_in_process_answer_after_the_deadline_is_dropped(views, pools):
    # No real plan takes under a nanosecond.
    link = PlannerLink(None, deadline_s=1e-9)
    assert link.plan_rotation(build_rotation_request(views, pools, NOW_S)) is None
    assert link.counters.snapshot().fallbacks[FallbackReason.DEADLINE] == 1


def test_deadline_must_be_positive():
    with pytest.raises(ValueError, match="deadline_s"):
        PlannerLink(None, deadline_s=0)


def test_counters_export_prometheus_metrics(views, pools):
    registry = CollectorRegistry()
    link = _loaded(
        PlannerLink(None, ROUND_TRIP_DEADLINE_S, FallbackCounters(registry, engine="vllm"))
    )
    link.plan_rotation(build_rotation_request(views, pools, NOW_S))
    bad = build_rotation_request(views, pools, NOW_S)
    bad.snapshot.columns.state[0] = common_pb2.REQUEST_STATE_UNSPECIFIED
    link.plan_rotation(bad)
    sample = registry.get_sample_value
    assert sample("planner_adapter_calls_total", {"engine": "vllm"}) == 2
    assert sample("planner_adapter_answers_total", {"engine": "vllm"}) == 1
    assert sample("planner_adapter_fallbacks_total", {"engine": "vllm", "reason": "error"}) == 1
    assert sample("planner_adapter_call_duration_seconds_count", {"engine": "vllm"}) == 2


@pytest.fixture
def stuck_in_process(monkeypatch):
    """In-process mode whose handler blocks until the test releases it."""
    release = threading.Event()
    # Set once a call is inside the handler.
    release.entered = threading.Event()
    real = in_process_service.handle

    def handle(rpc, request, ctx):
        release.entered.set()
        release.wait()
        return real(rpc, request, ctx)

    monkeypatch.setattr(in_process_service, "handle", handle)
    yield release
    release.set()


def test_in_process_planner_is_cut_off_at_the_deadline(views, pools, stuck_in_process):
    request = build_rotation_request(views, pools, NOW_S)
    with PlannerLink(None, deadline_s=0.005) as link:
        planner = link._local
        assert planner.wait_idle(ROUND_TRIP_DEADLINE_S)  # the handler is loaded
        # The handler never returns while the event is clear: the call
        # comes back only because it is cut off at the deadline.
        assert link.plan_rotation(request) is None
        # Still busy with that call: the next one falls back at once.
        assert planner.busy
        assert link.plan_rotation(request) is None
        snap = link.counters.snapshot()
        assert snap.fallbacks[FallbackReason.DEADLINE] == 2
        assert snap.latency.max_s < ROUND_TRIP_DEADLINE_S
        stuck_in_process.set()
        assert planner.wait_idle(ROUND_TRIP_DEADLINE_S)
        link.deadline_s = planner.deadline_s = ROUND_TRIP_DEADLINE_S
        assert link.plan_rotation(request) is not None
        assert link.counters.snapshot().ok == 1


def test_gil_switch_interval_is_short_only_during_a_call(views, pools):
    previous = sys.getswitchinterval()
    seen: list[float] = []
    with _loaded(PlannerLink(None, deadline_s=ROUND_TRIP_DEADLINE_S)) as link:
        real = link._ask

        def ask(rpc, request):
            seen.append(sys.getswitchinterval())
            return real(rpc, request)

        link._ask = ask
        assert link.plan_rotation(build_rotation_request(views, pools, NOW_S)) is not None
    assert seen == [pytest.approx(CALL_SWITCH_INTERVAL_S)]
    assert sys.getswitchinterval() == previous
    # Already shorter: left alone.
    with short_gil_switch_interval(1.0):
        assert sys.getswitchinterval() == previous


# ---- pipelined: sent after one step, taken at the next --------------------


def _answered(pipeline: PlanPipeline) -> None:
    """Waits until the call in flight has ended (the test's stand-in for a
    forward pass that lasts longer than the call)."""
    pipeline._in_flight.call._future.exception(timeout=ROUND_TRIP_DEADLINE_S)


# Over gRPC a pipelined call goes through a sending thread (the default) or
# starts as gRPC's own future; both must behave alike.
PIPELINED = pytest.mark.parametrize(
    ("remote", "send"),
    [(False, "grpc-future"), (True, "grpc-future"), (True, "sender-thread")],
    ids=["in-process", "grpc-future", "grpc-sender-thread"],
)
SENDS = pytest.mark.parametrize("send", ["grpc-future", "sender-thread"])


@PIPELINED
def test_pipelined_call_gives_the_plan_a_waited_call_gives(
    views, pools, planner_server, remote, send
):
    request = build_rotation_request(views, pools, NOW_S)
    target = planner_server.address if remote else None
    with PlannerLink(target, deadline_s=ROUND_TRIP_DEADLINE_S, pipelined_send=send) as link:
        waited = link.plan_rotation(request)
        pipeline = PlanPipeline(link)
        assert pipeline.send(request, "snapshot 1")
        answer = pipeline.take()
        snap = link.counters.snapshot()
    assert waited is not None
    assert answer == (waited, "snapshot 1")
    assert not pipeline.in_flight
    assert (snap.calls, snap.ok, snap.total_fallbacks) == (2, 2, 0)
    assert snap.wait.count == snap.latency.count == 2


@PIPELINED
def test_pipelined_answer_already_there_costs_the_step_nothing(
    views, pools, planner_server, remote, send
):
    target = planner_server.address if remote else None
    # A deadline no real call meets: the step may not wait at all.
    with PlannerLink(target, deadline_s=1e-9, pipelined_send=send) as link:
        pipeline = PlanPipeline(link)
        pipeline.send(build_rotation_request(views, pools, NOW_S), None)
        _answered(pipeline)
        answer = pipeline.take()
        snap = link.counters.snapshot()
    assert answer is not None
    assert _ids(answer[0].plan.prioritized) == ["w-late"]
    assert (snap.calls, snap.ok, snap.total_fallbacks) == (1, 1, 0)
    # The call took longer than the deadline; the step did not wait for it.
    assert snap.latency.max_s > 1e-9
    assert snap.wait.count == 1


def test_pipelined_late_answer_is_taken_at_a_later_step(views, pools, stuck_in_process):
    request = build_rotation_request(views, pools, NOW_S)
    with PlannerLink(None, deadline_s=0.005) as link:
        assert link._local.wait_idle(ROUND_TRIP_DEADLINE_S)
        pipeline = PlanPipeline(link, max_age_s=ROUND_TRIP_DEADLINE_S)
        assert pipeline.send(request, "first")
        # The planner is still on it: this step falls back, the call stays.
        assert pipeline.take() is None
        assert pipeline.in_flight
        assert not pipeline.send(request, "second")
        snap = link.counters.snapshot()
        assert (snap.calls, snap.fallbacks[FallbackReason.DEADLINE]) == (0, 1)
        stuck_in_process.set()
        _answered(pipeline)
        answer = pipeline.take()
        snap = link.counters.snapshot()
    assert answer is not None
    assert answer[1] == "first"
    # One step fell back, the next used the answer; one call.
    assert (snap.calls, snap.ok, snap.total_fallbacks) == (1, 1, 1)


@SENDS
def test_pipelined_call_to_a_stuck_planner_is_dropped_when_too_old(
    views, pools, stuck_server, send
):
    request = build_rotation_request(views, pools, NOW_S)
    with PlannerLink(stuck_server, deadline_s=0.005, pipelined_send=send) as link:
        pipeline = PlanPipeline(link, max_age_s=ROUND_TRIP_DEADLINE_S)
        pipeline.send(request, None)
        assert pipeline.take() is None
        assert pipeline.in_flight
        pipeline.max_age_s = 0.0
        assert pipeline.take() is None
        assert not pipeline.in_flight
        snap = link.counters.snapshot()
    assert snap.calls == 1
    assert snap.fallbacks[FallbackReason.DEADLINE] == snap.total_fallbacks == 2
    assert snap.ok == 0


@SENDS
def test_pipelined_call_to_a_stuck_planner_ends_at_its_time_limit(views, pools, stuck_server, send):
    """gRPC cuts the call at the time limit it was sent with: it ends as a
    `deadline` fallback although the server never answers."""
    with PlannerLink(stuck_server, deadline_s=0.005, pipelined_send=send) as link:
        pipeline = PlanPipeline(link, max_age_s=0.05)
        pipeline.send(build_rotation_request(views, pools, NOW_S), None)
        _answered(pipeline)
        assert pipeline.take() is None
        assert not pipeline.in_flight
        snap = link.counters.snapshot()
    assert snap.calls == 1
    assert snap.fallbacks[FallbackReason.DEADLINE] == snap.total_fallbacks == 1
    assert 0.05 <= snap.latency.max_s < ROUND_TRIP_DEADLINE_S


@SENDS
def test_pipelined_call_to_a_dead_planner_is_a_counted_fallback(views, pools, dead_target, send):
    with PlannerLink(dead_target, deadline_s=1.0, pipelined_send=send) as link:
        pipeline = PlanPipeline(link)
        pipeline.send(build_rotation_request(views, pools, NOW_S), None)
        assert pipeline.take() is None
        snap = link.counters.snapshot()
    # Refused at once, or (while the channel backs off) not there in time.
    refused = snap.fallbacks[FallbackReason.UNAVAILABLE] + snap.fallbacks[FallbackReason.DEADLINE]
    assert refused == snap.total_fallbacks == 1
    assert snap.ok == 0


def test_pipelined_send_while_the_planner_thread_is_busy(views, pools, stuck_in_process):
    request = build_rotation_request(views, pools, NOW_S)
    with PlannerLink(None, deadline_s=0.005) as link:
        planner = link._local
        assert planner.wait_idle(ROUND_TRIP_DEADLINE_S)
        pipeline = PlanPipeline(link, max_age_s=0.0)
        pipeline.send(request, None)
        assert stuck_in_process.entered.wait(ROUND_TRIP_DEADLINE_S)
        # Too old at once: dropped, but the planner thread is still on it.
        assert pipeline.take() is None
        assert planner.busy
        # Nothing can be sent to a busy thread: that step falls back at once.
        pipeline.send(request, None)
        assert pipeline.take() is None
        snap = link.counters.snapshot()
        assert (snap.calls, snap.fallbacks[FallbackReason.DEADLINE]) == (2, 2)
        stuck_in_process.set()
        assert planner.wait_idle(ROUND_TRIP_DEADLINE_S)
        link.deadline_s = pipeline.max_age_s = ROUND_TRIP_DEADLINE_S
        pipeline.send(request, None)
        assert pipeline.take() is not None


def test_a_pending_call_is_taken_once(views, pools):
    with PlannerLink(None, deadline_s=ROUND_TRIP_DEADLINE_S) as link:
        # The planner thread first loads its handler; a call sent meanwhile
        # falls back at once (what this test is not about).
        assert link._local.wait_idle(ROUND_TRIP_DEADLINE_S)
        call = link.send_rotation(build_rotation_request(views, pools, NOW_S))
        assert call.wait(link.counters)
        assert link.take_rotation(call) is not None
        with pytest.raises(RuntimeError, match="once"):
            link.take_rotation(call)


def test_gil_switch_interval_is_short_while_a_pipelined_call_is_in_flight(
    views, pools, stuck_in_process
):
    previous = sys.getswitchinterval()
    with PlannerLink(None, deadline_s=0.005) as link:
        assert link._local.wait_idle(ROUND_TRIP_DEADLINE_S)
        pipeline = PlanPipeline(link, max_age_s=ROUND_TRIP_DEADLINE_S)
        pipeline.send(build_rotation_request(views, pools, NOW_S), None)
        assert stuck_in_process.entered.wait(ROUND_TRIP_DEADLINE_S)
        # Between steps, with no one waiting on the call: still short.
        assert pipeline.take() is None
        assert sys.getswitchinterval() == pytest.approx(CALL_SWITCH_INTERVAL_S)
        stuck_in_process.set()
        _answered(pipeline)
        assert pipeline.take() is not None
    assert sys.getswitchinterval() == previous
