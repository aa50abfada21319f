"""VictimGate: when it says no running request can be a victim, the planner's
plan preempts nothing (random snapshots, the real planner in process); its
defaults are the planner's."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from planner.adapters.common.link import PlannerLink
from planner.adapters.common.snapshot import (
    EngineRequestView,
    PoolSizes,
    ViewState,
    build_rotation_request,
)
from planner.adapters.common.victim_gate import (
    DEFAULT_LOST_SLACK_TBTS,
    DEFAULT_PREEMPT_SLACK_TBTS,
    VictimGate,
)

from planner.domain.rotation import RotationParams
from planner.v1 import common_pb2, rotation_pb2

NOW_S = 1000.0
TBT_S = 0.1
LINK = PlannerLink(None, deadline_s=10.0)


def test_defaults_are_the_planners():
    assert RotationParams().preempt_slack_tbts == DEFAULT_PREEMPT_SLACK_TBTS
    assert RotationParams().lost_slack_tbts == DEFAULT_LOST_SLACK_TBTS


def test_the_slack_thresholds():
    gate = VictimGate(None, TBT_S)
    # 200 tokens since a first token 4 s ago: 20 - 4 = 16 s of slack, 160 TBTs.
    assert gate.any_victim([(NOW_S - 3.99, 200)], NOW_S)
    assert not gate.any_victim([(NOW_S - 4.01, 200)], NOW_S)
    assert not gate.any_victim([(NOW_S - 3.99, 199)], NOW_S)
    # Lost: slack below -10 TBTs (-1 s).
    assert gate.any_victim([(NOW_S - 3.1, 20)], NOW_S)
    assert not gate.any_victim([(NOW_S - 2.9, 20)], NOW_S)
    assert not gate.any_victim([(None, 0), (NOW_S - 1.0, 0)], NOW_S)
    no_lost = rotation_pb2.RotationParams(lost_slack_tbts=-1)
    assert not VictimGate(no_lost, TBT_S).any_victim([(NOW_S - 3.1, 20)], NOW_S)
    paper = rotation_pb2.RotationParams(variant=rotation_pb2.ROTATION_VARIANT_LVF_PAPER)
    assert VictimGate(paper, TBT_S).any_victim([], NOW_S)


running_request = st.tuples(
    st.floats(0.0, 30.0),  # first token this long ago
    st.integers(0, 400),  # tokens generated
    st.integers(1, 30),  # GPU blocks
)
waiting_request = st.tuples(st.floats(0.0, 10.0), st.integers(1, 600))


@settings(max_examples=150, deadline=None)
@given(
    running=st.lists(running_request, min_size=1, max_size=12),
    waiting=st.lists(waiting_request, min_size=1, max_size=12),
    free=st.integers(0, 8),
    preempt_slack=st.sampled_from([None, 20.0, 160.0]),
)
def test_no_victim_means_no_preemption(running, waiting, free, preempt_slack):
    views = []
    for i, (ago, generated, blocks) in enumerate(running):
        first = NOW_S - ago if generated else None
        views.append(
            EngineRequestView(
                f"r{i}", ViewState.RUNNING, 64, 64 + generated, generated, blocks, 0,
                arrival_s=NOW_S - ago - 1.0, run_start_s=NOW_S - ago - 0.5,
                last_token_s=NOW_S - 0.01 if generated else None, first_token_s=first,
            )
        )  # fmt: skip
    for i, (ago, prompt) in enumerate(waiting):
        views.append(
            EngineRequestView(f"w{i}", ViewState.WAITING, prompt, 0, 0, 0, 0, arrival_s=NOW_S - ago)
        )
    params = rotation_pb2.RotationParams()
    if preempt_slack is not None:
        params.preempt_slack_tbts = preempt_slack
    request = build_rotation_request(
        views,
        PoolSizes(free_gpu_blocks=free, block_size_tokens=16, free_cpu_blocks=10_000),
        NOW_S,
        slo=common_pb2.Slo(ttft_s=2.0, tbt_s=TBT_S),
        params=params,
    )
    LINK.wait_idle()
    response = LINK.plan_rotation(request)
    assert response is not None
    gate = VictimGate(params, TBT_S)
    pairs = [(v.first_token_s, v.output_tokens) for v in views if v.state is ViewState.RUNNING]
    if not gate.any_victim(pairs, NOW_S):
        assert not response.plan.preempted
