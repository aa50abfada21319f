"""Invariants of the bounded Largest-VLT-First (RotationVariant.LVF) over
random consistent snapshots, counts level and block level: the link budget
holds every copy, only lagging requests displace and only spare or lost
requests are displaced, the engine's limits hold, and the block-level plan
keeps DuplexKV's race-free invariant."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st
from rotation_builders import ROTARY, RUNNING, WAITING
from test_rotation_properties import Case, block_cases, check_block_plan, counts_cases

from planner.domain.requests import Slo, Snapshot, TrackedRequest
from planner.domain.rotation import RotationInputs, RotationParams, RotationPlan, RotationVariant
from planner.policies.rotation import blocks_needed, plan_rotation, virtual_lag_time
from planner.policies.rotation_bounded import tpot_slack_s
from planner.policies.rotation_budget import link_budget
from planner.profiles import HARDWARE_PROFILES, MODEL_PROFILES

SETTINGS = settings(max_examples=300, deadline=None)
NOW = 20.0


@st.composite
def lvf_inputs(draw) -> RotationInputs:
    model = hardware = None
    if draw(st.booleans()):
        model = draw(st.sampled_from(sorted(MODEL_PROFILES.values(), key=lambda m: m.name)))
        hardware = draw(st.sampled_from(sorted(HARDWARE_PROFILES.values(), key=lambda h: h.name)))
    return RotationInputs(
        params=RotationParams(
            alpha=draw(st.sampled_from([0.0, 1.0, 3.0])),
            beta_ttft=draw(st.sampled_from([0.0, 0.5, 2.0])),
            transfer_budget_blocks=draw(st.one_of(st.none(), st.integers(0, 40))),
            eager_budget_blocks=draw(st.one_of(st.none(), st.integers(0, 10))),
            variant=RotationVariant.LVF,
            preempt_slack_tbts=draw(st.sampled_from([0.0, 5.0, 40.0])),
            resume_slack_tbts=draw(st.sampled_from([0.0, 2.0, 10.0])),
            lost_slack_tbts=draw(st.sampled_from([None, 0.0, 5.0])),
        ),
        slo=Slo(draw(st.sampled_from([1.0, 5.0])), draw(st.sampled_from([0.1, 0.5]))),
        model=model,
        hardware=hardware,
    )


@st.composite
def lvf_cases(draw) -> Case:
    """A case of the Algorithm 1 properties with token counts and first
    token times on some running and rotary requests, and sometimes the
    engine's limits."""
    case = draw(st.one_of(counts_cases(), block_cases()))
    requests = []
    for request in case.requests:
        r = request
        if r.state != WAITING and draw(st.booleans()):
            # Slack from far behind to far ahead of the TPOT SLO (0.1 or
            # 0.5 s per token).
            generated = draw(st.integers(1, 400))
            slack = draw(st.sampled_from([-30.0, -1.0, 0.5, 5.0, 30.0, 200.0]))
            per_token = draw(st.sampled_from([0.1, 0.5]))
            first = min(NOW - per_token * generated + slack, NOW)
            r = dataclasses.replace(r, output_tokens=generated, first_token_s=first)
        if draw(st.booleans()):
            r = dataclasses.replace(r, prefill_tokens=draw(st.integers(1, 200)))
        requests.append(r)
    return dataclasses.replace(
        case,
        requests=tuple(requests),
        max_batched_tokens=draw(st.one_of(st.none(), st.integers(1, 300))),
        max_running=draw(st.one_of(st.none(), st.integers(1, 8))),
    )


@st.composite
def contended_cases(draw) -> Case:
    """Counts-level snapshots under contention where LVF's rules decide:
    running requests with slack to spare, short of it or lost; waiting
    requests inside and past their tolerance and TTFT SLO; rotary requests
    with a little, a lot or lost slack (default SLOs: 5 s, 100 ms)."""
    requests: list[TrackedRequest] = []
    for i in range(draw(st.integers(1, 5))):
        gpu = draw(st.integers(1, 12))
        generated = draw(st.integers(1, 400))
        slack = draw(st.sampled_from([-30.0, -2.0, 0.5, 5.0, 20.0, 200.0]))
        requests.append(
            TrackedRequest(
                f"run{i}",
                RUNNING,
                run_start_s=draw(st.sampled_from([1.0, 5.0, 10.0, 19.0])),
                gpu_blocks=gpu,
                num_tokens=gpu * 16,
                synced_blocks=draw(st.integers(0, gpu)),
                output_tokens=generated,
                first_token_s=min(NOW - 0.1 * generated + slack, NOW),
            )
        )
    for i in range(draw(st.integers(0, 3))):
        requests.append(
            TrackedRequest(
                f"wait{i}",
                WAITING,
                arrival_s=NOW - draw(st.sampled_from([1.0, 3.0, 4.5, 8.0])),
                prompt_blocks=draw(st.integers(1, 15)),
            )
        )
    for i in range(draw(st.integers(0, 3))):
        generated = draw(st.integers(2, 400))
        slack = draw(st.sampled_from([-30.0, -0.5, 0.5, 30.0]))
        requests.append(
            TrackedRequest(
                f"rot{i}",
                ROTARY,
                last_token_s=NOW - 0.5,
                cpu_blocks=draw(st.integers(1, 12)),
                output_tokens=generated,
                first_token_s=min(NOW - 0.1 * generated + slack, NOW - 0.5),
            )
        )
    return Case(
        tuple(requests),
        free_gpu_blocks=draw(st.integers(0, 10)),
        free_cpu_blocks=draw(st.one_of(st.none(), st.integers(0, 30))),
        last_iteration_s=None,
        max_batched_tokens=draw(st.one_of(st.none(), st.integers(1, 300))),
        max_running=draw(st.one_of(st.none(), st.integers(1, 8))),
    )


def snapshot_of(case: Case) -> Snapshot:
    s = case.snapshot()
    return dataclasses.replace(
        s,
        max_batched_tokens=case.max_batched_tokens,
        max_running_requests=case.max_running,
    )


def check_lvf_plan(snapshot: Snapshot, inputs: RotationInputs, plan: RotationPlan) -> None:
    t = snapshot.requests
    p = inputs.params
    row = {rid: i for i, rid in enumerate(t.ids)}
    vlt = virtual_lag_time(t, snapshot.now_s, inputs)
    need = blocks_needed(t)
    slack = tpot_slack_s(t, snapshot.now_s, inputs)
    tbt = np.where(np.isnan(t.slo_tbt_s), inputs.slo.tbt_s, t.slo_tbt_s)
    e = plan.explanation
    pri = [row[d.id] for d in plan.prioritized]
    pre = [row[d.id] for d in plan.preempted]
    assert e.variant == RotationVariant.LVF

    # Victims: running, with slack to spare or their TPOT SLO lost.
    for i in pre:
        assert t.state[i] == RUNNING and vlt[i] < 0
        spare = slack[i] >= p.preempt_slack_tbts * tbt[i]
        lost = p.lost_slack_tbts is not None and slack[i] < -p.lost_slack_tbts * tbt[i]
        assert spare or lost, (t.ids[i], slack[i])

    # The link budget holds every copy (one swap-in alone may exceed it).
    budget = link_budget(snapshot.last_iteration_s, snapshot.block_size_tokens, inputs)
    assert (e.transfer_budget_blocks, e.d2h_budget_blocks) == (budget.h2d_blocks, budget.d2h_blocks)
    # Zero-block swap-ins move nothing: "alone" counts the others.
    swap_ins = [d.blocks for d in plan.prioritized if d.state == ROTARY and d.blocks > 0]
    out = e.swap_out_blocks + e.eager_blocks
    if budget.shared:
        assert e.swap_in_blocks + out <= budget.h2d_blocks or (
            len(swap_ins) == 1 and out <= budget.h2d_blocks
        )
    else:
        assert e.swap_in_blocks <= budget.h2d_blocks or len(swap_ins) == 1
        assert out <= budget.d2h_blocks
    if p.eager_budget_blocks is not None:
        assert e.eager_blocks <= p.eager_budget_blocks

    # Blocks: admissions within free + freed, swap-ins within free + released.
    free = snapshot.free_gpu_blocks
    assert int(need[pri].sum()) <= free + e.blocks_released_now + e.blocks_freed_after_d2h
    assert e.swap_in_blocks == sum(swap_ins) <= free + e.blocks_released_now
    # Preemption only when what is prioritized does not fit in the free blocks.
    if pre:
        assert int(need[pri].sum()) > free
        assert not plan.fcfs_fallback

    # The engine's limits: running slots, and the token budget is open
    # before each waiting request is admitted.
    running = t.state == RUNNING
    if snapshot.max_running_requests is not None:
        assert len(pri) <= max(snapshot.max_running_requests - int(running.sum()), 0)
    if snapshot.max_batched_tokens is not None:
        used = sum(
            max(int(t.prefill_tokens[i] - t.num_tokens[i]), 1)
            if t.prefill_tokens[i] >= 0 and t.num_tokens[i] >= 0
            else 1
            for i in np.flatnonzero(running)
        )
        room = snapshot.max_batched_tokens - used
        for i in pri:
            if t.state[i] != WAITING:
                continue
            assert room > 0
            prefill = t.prefill_tokens[i] if t.prefill_tokens[i] >= 0 else t.prompt_blocks[i] * 16
            room -= max(int(prefill) - max(int(t.num_tokens[i]), 0), 1)

    # Without contention: arrival order, nothing preempted.
    inactive = [i for i in range(len(t)) if t.state[i] != RUNNING]
    if free >= int(need[inactive].sum()):
        assert plan.fcfs_fallback and pre == []
        arrivals = [t.arrival_s[i] if not math.isnan(t.arrival_s[i]) else math.inf for i in pri]
        assert arrivals == sorted(arrivals)


@SETTINGS
@given(st.one_of(lvf_cases(), contended_cases()), lvf_inputs())
def test_lvf_invariants(case, inputs):
    snapshot = snapshot_of(case)
    plan = plan_rotation(snapshot, inputs)
    check_lvf_plan(snapshot, inputs, plan)
    event(f"preempted {min(len(plan.preempted), 2)}")
    if snapshot.pools is not None:
        check_block_plan(snapshot, inputs, plan)


@SETTINGS
@given(st.one_of(lvf_cases(), contended_cases()), lvf_inputs(), st.randoms())
def test_lvf_plan_ignores_request_order(case, inputs, rnd):
    order = list(range(len(case.requests)))
    rnd.shuffle(order)
    shuffled = dataclasses.replace(case, requests=tuple(case.requests[i] for i in order))
    assert plan_rotation(snapshot_of(shuffled), inputs) == plan_rotation(snapshot_of(case), inputs)


def test_unknown_slack_is_never_a_victim():
    """Engines that send no token counts get no LVF preemptions at all."""
    requests = [
        TrackedRequest("r", RUNNING, run_start_s=1.0, gpu_blocks=10),
        TrackedRequest("w", WAITING, arrival_s=NOW - 4.0, prompt_blocks=20),
    ]
    case = Case(tuple(requests), free_gpu_blocks=0, free_cpu_blocks=None, last_iteration_s=None)
    plan = plan_rotation(snapshot_of(case), RotationInputs())
    assert plan.preempted == () and plan.prioritized == ()
