"""The vLLM adapter's plain-Python parts, in the normal test tier (no vLLM
needed): the swap ledger's block accounting and copy ordering, the request
clock, and the settings read from additional_config."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from planner.adapters.vllm.request_clock import RequestClock
from planner.adapters.vllm.settings import DEFAULT_TBT_SLO_S, PlannerSettings
from planner.adapters.vllm.swap_ledger import SwapLedger

from planner.domain.requests import DEFAULT_TBT_SLO_S as PLANNER_DEFAULT_TBT_SLO_S
from planner.v1 import rotation_pb2


def test_swap_out_then_in_copies_the_request_blocks_in_logical_order():
    ledger = SwapLedger(num_cpu_blocks=8, block_size_tokens=16)
    assert ledger.swap_out("a", [9, 4, 6], num_tokens=35)
    step = ledger.take_step()
    assert (step.swap_out.src, step.swap_out.dst) == ([9, 4, 6], [0, 1, 2])
    assert ledger.free_cpu_blocks == 5
    # 16 tokens are a local hit; tokens 16..34 come back into blocks 1 and 2.
    assert ledger.loadable_tokens("a", total_tokens=36, local_tokens=16) == 19
    ledger.swap_in("a", [11, 12, 13], local_tokens=16, num_tokens=19)
    step = ledger.take_step()
    assert (step.swap_in.src, step.swap_in.dst) == ([1, 2], [12, 13])
    assert ledger.free_cpu_blocks == 8
    assert ledger.swapped("a") is None
    assert (ledger.swap_outs, ledger.swap_ins, ledger.refused) == (1, 1, 0)


def test_the_last_token_is_always_left_to_compute():
    ledger = SwapLedger(num_cpu_blocks=4, block_size_tokens=16)
    ledger.swap_out("a", [0, 1], num_tokens=20)
    assert ledger.loadable_tokens("a", total_tokens=20, local_tokens=0) == 19
    assert ledger.loadable_tokens("b", total_tokens=20, local_tokens=0) == 0


def test_a_full_cpu_pool_refuses_and_vllm_recomputes():
    ledger = SwapLedger(num_cpu_blocks=2, block_size_tokens=16)
    assert not ledger.swap_out("a", [0, 1, 2], num_tokens=40)
    assert not ledger.swap_out("b", [3], num_tokens=0)
    assert ledger.refused == 2
    assert ledger.free_cpu_blocks == 2
    assert len(ledger.take_step().swap_out) == 0


def test_cpu_blocks_read_by_a_swap_in_are_not_reused_in_the_same_step():
    ledger = SwapLedger(num_cpu_blocks=2, block_size_tokens=16)
    ledger.swap_out("a", [0, 1], num_tokens=32)
    ledger.take_step()
    ledger.swap_in("a", [2, 3], local_tokens=0, num_tokens=31)
    # Same step: b's D2H would overwrite a's blocks before a's H2D reads them.
    assert not ledger.swap_out("b", [4, 5], num_tokens=32)
    ledger.take_step()
    assert ledger.swap_out("b", [4, 5], num_tokens=32)


@given(
    st.lists(
        st.tuples(
            st.sampled_from("abcd"),
            st.sampled_from(["out", "in", "drop", "step"]),
            st.integers(1, 60),
        ),
        max_size=60,
    )
)
def test_cpu_blocks_are_never_lost_or_shared(ops):
    ledger = SwapLedger(num_cpu_blocks=10, block_size_tokens=16)
    for rid, op, tokens in ops:
        if op == "out":
            ledger.swap_out(rid, list(range(4)), tokens)
        elif op == "in" and ledger.swapped(rid) is not None:
            n = ledger.loadable_tokens(rid, tokens + 61, 0)
            ledger.swap_in(rid, list(range(4)), 0, n)
        elif op == "drop":
            ledger.drop(rid)
        else:
            ledger.take_step()
        held = [b for r in "abcd" if (kv := ledger.swapped(r)) for b in kv.cpu_block_ids]
        assert len(held) == len(set(held))
        assert ledger.free_cpu_blocks + len(held) <= 10
    for rid in "abcd":
        ledger.drop(rid)
    ledger.take_step()
    assert ledger.free_cpu_blocks == 10


def test_request_clock_keeps_run_start_and_last_token():
    clock = RequestClock()
    clock.mark_running(["a"], 1.0)
    clock.mark_running(["a", "b"], 2.0)
    clock.mark_tokens(["a"], 2.5)
    assert (clock.run_start_s("a"), clock.run_start_s("b")) == (1.0, 2.0)
    clock.mark_running(["b"], 3.0)  # a preempted
    assert clock.run_start_s("a") is None
    assert clock.last_token_s("a") == 2.5
    clock.mark_running(["a", "b"], 4.0)  # a back
    assert clock.run_start_s("a") == 4.0
    clock.forget(["b"])
    assert clock.last_token_s("a") is None
    assert clock.run_start_s("b") == 2.0


def test_rotation_settings_become_the_params_sent_with_each_snapshot():
    settings = PlannerSettings.from_additional_config(
        {"planner": {"rotation": {"variant": "lvf-paper", "preempt_slack_tbts": 40}}}
    )
    params = settings.rotation
    assert params is not None
    assert params.variant == rotation_pb2.ROTATION_VARIANT_LVF_PAPER
    assert params.preempt_slack_tbts == 40.0
    assert not params.HasField("resume_slack_tbts")
    assert PlannerSettings.from_additional_config({}).rotation is None


def test_settings_default_to_in_process_pipelined_with_a_5_ms_deadline():
    settings = PlannerSettings.from_additional_config({})
    assert (settings.target, settings.deadline_s, settings.planning) == (None, 0.005, "pipelined")
    synchronous = PlannerSettings.from_additional_config({"planner": {"planning": "synchronous"}})
    assert synchronous.planning == "synchronous"
    # vLLM's own preemptions are recomputed, as without the plugin, unless
    # asked for by name.
    assert settings.engine_preemptions == "recompute"
    swap = PlannerSettings.from_additional_config({"planner": {"engine_preemptions": "swap"}})
    assert swap.engine_preemptions == "swap"
    # A pipelined call goes out through the sending thread unless asked otherwise.
    assert settings.pipelined_send == "sender-thread"
    future = PlannerSettings.from_additional_config({"planner": {"pipelined_send": "grpc-future"}})
    assert future.pipelined_send == "grpc-future"
    settings = PlannerSettings.from_additional_config(
        {"planner": {"target": "10.0.0.1:50051", "deadline_ms": 2, "slo_tbt_s": 0.05}}
    )
    assert (settings.target, settings.deadline_s, settings.slo_tbt_s) == (
        "10.0.0.1:50051",
        0.002,
        0.05,
    )


@pytest.mark.parametrize(
    ("planner", "field"),
    [
        ({"deadline_ms": 0}, "deadline_ms"),
        ({"deadline_ms": "5"}, "deadline_ms"),
        ({"target": "nohost"}, "target"),
        ({"slo_ttft_s": -1}, "slo_ttft_s"),
        ({"deadlin_ms": 5}, "deadlin_ms"),
        ({"rotation": {"variant": "fcfs"}}, "rotation.variant"),
        ({"rotation": {"preempt_slack_tbts": "a lot"}}, "rotation.preempt_slack_tbts"),
        ({"rotation": {"slack": 1}}, "rotation.slack"),
        ({"rotation": []}, "rotation"),
        ({"planning": "async"}, "planning"),
        ({"pipelined_send": "thread"}, "pipelined_send"),
        ({"engine_preemptions": "offload"}, "engine_preemptions"),
        ({"call_timing_log": "calls.jsonl"}, "call_timing_log"),
        ({"target": "127.0.0.1:50051", "call_timing_log": ""}, "call_timing_log"),
    ],
)
def test_bad_settings_name_their_field(planner, field):
    with pytest.raises(ValueError, match=rf"additional_config\.planner\.{field}"):
        PlannerSettings.from_additional_config({"planner": planner})


def test_the_deposit_slo_default_is_the_planners():
    # The adapter keeps its own copy (it does not import the domain).
    assert DEFAULT_TBT_SLO_S == PLANNER_DEFAULT_TBT_SLO_S
