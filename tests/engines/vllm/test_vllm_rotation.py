"""PlannerScheduler + PlannerSwapConnector on vLLM's real V1 scheduler under
memory pressure: the planner's preemptions and admissions happen, swapped KV
comes back bit-exactly (the driver checks every earlier token's KV before
each forward and scribbles on every free block), and every request finishes
exactly once with all its tokens, whether the planner answers, is dead, or
is stuck."""

from __future__ import annotations

import json

import pytest

from . import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

from planner.adapters.common.counters import FallbackReason
from vllm.v1.request import RequestStatus

pytestmark = pytest.mark.engines

# 6 requests of 40-token prompts growing to 80 tokens: 30 blocks of demand
# on 12 GPU blocks.
PROMPT_TOKENS = 40
MAX_TOKENS = 40
NUM_REQUESTS = 6
SLO = {"slo_ttft_s": 0.2, "slo_tbt_s": 0.1}


def _load(run) -> None:
    for i in range(NUM_REQUESTS):
        run.add(f"r{i}", PROMPT_TOKENS, MAX_TOKENS)


def _assert_all_finished_once(run) -> None:
    assert sorted(run.finished) == sorted(f"r{i}" for i in range(NUM_REQUESTS))
    assert run.tokens == {f"r{i}": MAX_TOKENS for i in range(NUM_REQUESTS)}
    connector = run.scheduler.connector
    assert connector.ledger.free_cpu_blocks == connector.num_cpu_blocks


@pytest.mark.parametrize("planning", ["pipelined", "synchronous"])
def test_planner_rotates_requests_and_swaps_kv(engine, planning):
    # The paper's Algorithm 1 rotates whatever the requests' TPOT slack, so
    # these short requests rotate (the bounded LVF would leave them be).
    run = engine(
        {
            "deadline_ms": 10_000,
            "planning": planning,
            "rotation": {"variant": "lvf-paper"},
            **SLO,
        }
    )
    _load(run)
    planned_preemptions = 0
    planned_first_runs = 0
    for _ in range(2000):
        if not run.scheduler.has_requests():
            break
        run.step()
        actions = run.scheduler.last_actions
        if actions is None or not actions.preempt:
            continue
        planned_preemptions += len(actions.preempt)
        out = run.last_output
        # vLLM reports the planner's preemptions, and the request the
        # planner put first runs in that very step (unless the planner
        # deferred every pick to the next step, after the copies out).
        assert set(actions.preempt) <= out.preempted_req_ids
        assert actions.resume or actions.deferred
        if actions.resume:
            assert actions.resume[0] in out.num_scheduled_tokens
            planned_first_runs += 1
    _assert_all_finished_once(run)
    counters = run.scheduler.planner_counters.snapshot()
    ledger = run.scheduler.connector.ledger
    assert planned_preemptions >= 1
    assert planned_first_runs >= 1
    assert counters.ok == counters.calls > 0
    assert counters.total_fallbacks == 0
    # The planner's preemptions, and only those, were swapped (vLLM's own
    # are recomputed, as without the plugin); every swap-out came back in.
    assert ledger.swap_ins == ledger.swap_outs == planned_preemptions
    assert ledger.refused == 0


@pytest.mark.parametrize("engine_preemptions", ["recompute", "swap"])
def test_dead_planner_falls_back_to_vllm_without_losing_a_request(
    engine, dead_target, engine_preemptions
):
    run = engine(
        {
            "target": dead_target,
            "deadline_ms": 1_000,
            "engine_preemptions": engine_preemptions,
            **SLO,
        }
    )
    _load(run)
    run.run()
    _assert_all_finished_once(run)
    counters = run.scheduler.planner_counters.snapshot()
    refused = counters.fallbacks[FallbackReason.UNAVAILABLE]
    late = counters.fallbacks[FallbackReason.DEADLINE]
    assert counters.calls > 0
    assert refused >= 1
    assert refused + late == counters.calls
    assert counters.ok == 0
    # vLLM's own preemptions: recomputed, as vLLM does without the plugin
    # (the default), or swapped through the connector.
    assert run.preempted
    ledger = run.scheduler.connector.ledger
    if engine_preemptions == "recompute":
        assert ledger.swap_outs == ledger.swap_ins == 0
    else:
        assert ledger.swap_ins == ledger.swap_outs == len(run.preempted)


@pytest.mark.parametrize("planning", ["pipelined", "synchronous"])
def test_stuck_planner_falls_back_at_the_deadline(engine, stuck_server, planning):
    run = engine({"target": stuck_server, "deadline_ms": 5, "planning": planning, **SLO})
    _load(run)
    run.run()
    _assert_all_finished_once(run)
    counters = run.scheduler.planner_counters.snapshot()
    assert counters.ok == 0
    late = counters.fallbacks[FallbackReason.DEADLINE]
    assert late > 0
    assert late == counters.total_fallbacks
    if planning == "synchronous":
        # Each step waited for its own call.
        assert late == counters.calls
    else:
        # A call stays in flight over the steps it is late for, until it is
        # too old: each of those steps is a fallback, the call counted once
        # when it ends (the last one may still be in flight when the run
        # ends, since the engine asks only while a victim is possible).
        assert late > counters.calls


def test_without_the_connector_the_planner_rotates_by_recompute(engine):
    run = engine({"deadline_ms": 10_000, **SLO}, swap=False)
    _load(run)
    run.run()
    assert run.scheduler.connector is None
    assert sorted(run.finished) == sorted(f"r{i}" for i in range(NUM_REQUESTS))
    assert run.tokens == {f"r{i}": MAX_TOKENS for i in range(NUM_REQUESTS)}
    counters = run.scheduler.planner_counters.snapshot()
    assert counters.ok == counters.calls > 0
    assert run.preempted


def test_pipelined_plan_applies_at_the_next_step_unless_stale(engine):
    """The plan sent after one step is what the next step carries out; when
    a request it admits has gone meanwhile (aborted here), that step is
    vLLM's own, counted as stale-plan, and nothing else is lost."""
    run = engine(
        {"deadline_ms": 10_000, "rotation": {"variant": "lvf-paper"}, "reorder": "always", **SLO}
    )
    _load(run)
    aborted = None
    applied = 0
    for _ in range(2000):
        if not run.scheduler.has_requests():
            break
        run.step()
        in_flight = run.scheduler.pipeline._in_flight
        if in_flight is None:
            continue
        # The answer, as it arrives while the model runs.
        plan = in_flight.call._future.result(timeout=10).plan
        if plan.fcfs_fallback or not plan.prioritized:
            continue
        if applied and aborted is None:
            aborted = plan.prioritized[0].id
            run.scheduler.finish_requests(aborted, RequestStatus.FINISHED_ABORTED)
            run.step()
            assert run.scheduler.last_actions is None
            counters = run.scheduler.planner_counters.snapshot()
            assert counters.fallbacks[FallbackReason.STALE_PLAN] == 1
            continue
        run.step()
        actions = run.scheduler.last_actions
        assert actions is not None
        assert actions.resume == tuple(d.id for d in plan.prioritized)
        applied += 1
    assert aborted is not None
    assert applied >= 1
    rest = {f"r{i}" for i in range(NUM_REQUESTS)} - {aborted}
    assert set(run.finished) == rest
    assert all(run.tokens[rid] == MAX_TOKENS for rid in rest)
    counters = run.scheduler.planner_counters.snapshot()
    assert counters.ok == counters.calls
    assert counters.total_fallbacks == counters.fallbacks[FallbackReason.STALE_PLAN] >= 1


def test_plan_order_is_the_waiting_queue_order(engine):
    # The plan's prioritized requests start in the plan's order, ahead of
    # the rest (vLLM's own prepend_requests would reverse them).
    run = engine({"deadline_ms": 10_000, **SLO})
    _load(run)
    scheduler = run.scheduler
    first = [scheduler.requests[rid] for rid in ("r4", "r1", "r3")]
    scheduler.waiting.remove_requests(first)
    scheduler.put_first(first)
    assert [r.request_id for r in scheduler.waiting] == ["r4", "r1", "r3", "r0", "r2", "r5"]


def test_a_plan_that_preempts_nothing_leaves_vllms_order(engine, tmp_path):
    """By default a plan's order is applied only with its preemptions: a step
    whose plan only prioritizes admits exactly what vLLM's own order does
    (the head of its waiting queue), and the decision log says so."""
    log = tmp_path / "decisions.jsonl"
    run = engine(
        {
            "deadline_ms": 10_000,
            "planning": "synchronous",
            "rotation": {"variant": "lvf-paper"},
            "decision_log": str(log),
            **SLO,
        }
    )
    _load(run)
    run.run()
    _assert_all_finished_once(run)
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    kept = [s for s in steps if s["applied"] == "engine-order"]
    applied = [s for s in steps if s["applied"] == "applied"]
    assert kept, "no plan prioritized without preempting"
    for step in kept:
        assert step["prioritized"] and not step["plan_preempted"]
        # (new requests listed before resumed ones)
        assert set(step["admitted"]) == set(step["engine_order"][: len(step["admitted"])])
    for step in applied:
        assert step["plan_preempted"]
        assert set(step["plan_preempted"]) <= set(step["preempted"])
        if step["prioritized"]:
            assert step["prioritized"][0] in step["admitted"]
    assert {s["applied"] for s in steps} <= {"engine-order", "applied", "fcfs", "none"}


def test_no_call_while_no_running_request_could_be_a_victim(engine, tmp_path):
    """The default `lvf` preempts only requests with 160 TBTs of TPOT slack
    or a lost TPOT SLO: while no running request is one, the step is vLLM's
    own and the planner is not asked."""
    log = tmp_path / "decisions.jsonl"
    run = engine(
        {"deadline_ms": 10_000, "planning": "synchronous", "decision_log": str(log), **SLO}
    )
    _load(run)
    run.run()
    _assert_all_finished_once(run)
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    skipped = [s for s in steps if s["applied"] == "no-victim"]
    asked = [s for s in steps if s["applied"] != "no-victim"]
    assert skipped
    for step in skipped:
        assert step["prioritized"] is None
        # (new requests listed before resumed ones)
        assert set(step["admitted"]) == set(step["engine_order"][: len(step["admitted"])])
    assert run.scheduler.planner_counters.snapshot().calls == len(asked)
