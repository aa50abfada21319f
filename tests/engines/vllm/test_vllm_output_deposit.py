"""Token-Deposit on vLLM's output path, on vLLM's own output types: a
depositing request's first token goes out and anchors the schedule, later
tokens are released one per TBT SLO in order (in an output made for them
when the request produced none that step), request events ride with the next
token, the finish flushes the rest, an output carrying more than tokens
(here KV-transfer parameters) flushes first, and an aborted request's tokens are dropped."""

from __future__ import annotations

import pytest

from . import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

from planner.adapters.vllm.output_deposit import OutputDeposit
from vllm.v1.engine import (
    EngineCoreEvent,
    EngineCoreEventType,
    EngineCoreOutput,
    EngineCoreOutputs,
    FinishReason,
)

pytestmark = pytest.mark.engines

SLO_S = 0.25
DEPOSITING = {"a": SLO_S}


def _step(deposit, now_s, *outputs, live=("a",), depositing=DEPOSITING):
    result = deposit.apply({0: EngineCoreOutputs(outputs=list(outputs))}, depositing, live, now_s)
    return [(o.request_id, list(o.new_token_ids), o.finish_reason) for o in result[0].outputs]


def _out(rid, *tokens, finish=None, **extra):
    return EngineCoreOutput(
        request_id=rid, new_token_ids=list(tokens), finish_reason=finish, **extra
    )


def test_tokens_are_released_one_per_slo_in_order_and_flushed_at_finish():
    deposit = OutputDeposit()
    assert _step(deposit, 0.0, _out("a", 1)) == [("a", [1], None)]
    # Generated every 0.125 s; due at 0.25, 0.5, 0.75, ...
    assert _step(deposit, 0.125, _out("a", 2)) == []
    assert _step(deposit, 0.25, _out("a", 3)) == [("a", [2], None)]
    assert _step(deposit, 0.375, _out("a", 4)) == []
    assert deposit.balance("a") == 2
    # A step without output of "a" still releases its due token.
    assert _step(deposit, 0.5, _out("b", 9)) == [("b", [9], None), ("a", [3], None)]
    assert _step(deposit, 0.625, _out("a", 5, finish=FinishReason.LENGTH)) == [
        ("a", [4, 5], FinishReason.LENGTH)
    ]
    assert deposit.deposit.request_ids() == ()
    counts = deposit.counts
    assert (counts.deposited, counts.released, counts.flushed) == (4, 2, 2)


def test_request_events_ride_with_the_next_released_token():
    deposit = OutputDeposit()
    _step(deposit, 0.0, _out("a", 1))
    event = EngineCoreEvent.new_event(EngineCoreEventType.SCHEDULED, 0.1)
    assert _step(deposit, 0.125, _out("a", 2, events=[event])) == []
    result = deposit.apply({0: EngineCoreOutputs(outputs=[_out("a", 3)])}, DEPOSITING, ("a",), 0.25)
    (out,) = result[0].outputs
    assert list(out.new_token_ids) == [2]
    assert out.events == [event]


def test_an_output_the_deposit_cannot_hold_flushes_it_in_its_own_output_first():
    deposit = OutputDeposit()
    _step(deposit, 0.0, _out("a", 1))
    _step(deposit, 0.125, _out("a", 2))
    marked = _out("a", 3, kv_transfer_params={"x": 1})
    assert _step(deposit, 0.2, marked) == [("a", [2], None), ("a", [3], None)]
    assert deposit.deposit.request_ids() == ()


def test_an_aborted_requests_held_tokens_are_dropped():
    deposit = OutputDeposit()
    _step(deposit, 0.0, _out("a", 1))
    _step(deposit, 0.125, _out("a", 2))
    assert _step(deposit, 0.5, live=()) == []
    assert deposit.deposit.request_ids() == ()
    assert deposit.counts.dropped == 1
    assert deposit.counts.released == 0


def test_requests_outside_the_plan_pass_through():
    deposit = OutputDeposit()
    for t in (0.0, 0.1, 0.2):
        assert _step(deposit, t, _out("b", 7), live=("b",)) == [("b", [7], None)]
    assert deposit.counts.deposited == 0
