"""The plugin's hooks on the recorded SGLang structures, with the real
planner in process and over gRPC on loopback, and with a dead or slow one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from planner.adapters.common.counters import FallbackReason
from planner.adapters.common.link import PlannerLink
from planner.adapters.sglang.plugin import PlannerScheduling, rotate_out
from sglang_recorded import (
    NOW_S,
    Req,
    ScheduleBatch,
    Scheduler,
    TokenAllocator,
    sglang_retraction_order,
)

from planner.service.server import PlannerServer

# In-process answers on a loaded 2-core CI box can take far more than 5 ms;
# these tests are about what a plan does, not how fast it comes.
GENEROUS_DEADLINE_S = 30.0


def scheduling(link: PlannerLink) -> PlannerScheduling:
    return PlannerScheduling(link, clock=lambda: NOW_S)


def rids(reqs: list[Req]) -> list[str]:
    return [r.rid for r in reqs]


def every_rid(batch: ScheduleBatch, scheduler: Scheduler) -> list[str]:
    return sorted(rids(batch.reqs) + rids(scheduler.waiting_queue))


def popped_first(order: list[int], reqs: list[Req]) -> str:
    return reqs[order[-1]].rid


def test_planner_admits_the_late_request_and_preempts_the_oldest(
    scheduler: Scheduler, batch: ScheduleBatch
) -> None:
    plugin = scheduling(PlannerLink(deadline_s=GENEROUS_DEADLINE_S))
    actions = plugin.plan_step(scheduler, batch.reqs)
    assert actions is not None
    assert actions.resume == ("w-late", "w-fresh")
    assert actions.preempt == ("r-old",)


def test_retraction_order_follows_the_planner(scheduler: Scheduler, batch: ScheduleBatch) -> None:
    plugin = scheduling(PlannerLink(deadline_s=GENEROUS_DEADLINE_S))
    assert popped_first(sglang_retraction_order(batch.reqs), batch.reqs) == "r-new"
    plugin.plan_step(scheduler, batch.reqs)
    order = plugin.retraction_order(sglang_retraction_order, batch.reqs)
    assert popped_first(order, batch.reqs) == "r-old"
    assert sorted(order) == [0, 1]


def test_waiting_queue_starts_with_the_prioritized_request(
    scheduler: Scheduler, batch: ScheduleBatch
) -> None:
    plugin = scheduling(PlannerLink(deadline_s=GENEROUS_DEADLINE_S))
    plugin.plan_step(scheduler, batch.reqs)
    queue = scheduler.waiting_queue
    plugin.after_calc_priority(None, object(), queue, batch, processed_tokens=0)
    assert rids(queue) == ["w-late", "w-fresh"]
    assert queue is scheduler.waiting_queue


def test_running_batch_update_rotates_the_preempted_request_out(
    scheduler: Scheduler, batch: ScheduleBatch
) -> None:
    plugin = scheduling(PlannerLink(deadline_s=GENEROUS_DEADLINE_S))
    before = every_rid(batch, scheduler)
    r_old = batch.reqs[0]
    plugin.plan_step(scheduler, batch.reqs)
    result = plugin.update_running_batch(lambda s, b: b, scheduler, batch)
    assert result is batch
    assert rids(batch.reqs) == ["r-new"]
    assert scheduler.waiting_queue[-1] is r_old
    assert not r_old.holds_kv
    assert scheduler.token_to_kv_pool_allocator.available_size() == 64 + 128
    assert every_rid(batch, scheduler) == before
    assert plugin.rotated == 1


def test_sglang_skipping_decode_is_left_alone(scheduler: Scheduler, batch: ScheduleBatch) -> None:
    plugin = scheduling(PlannerLink(deadline_s=GENEROUS_DEADLINE_S))
    plugin.plan_step(scheduler, batch.reqs)
    assert plugin.update_running_batch(lambda s, b: None, scheduler, batch) is None
    assert rids(batch.reqs) == ["r-old", "r-new"]


def test_plan_lives_for_one_scheduler_step(scheduler: Scheduler, batch: ScheduleBatch) -> None:
    plugin = scheduling(PlannerLink(deadline_s=GENEROUS_DEADLINE_S))
    seen: list[Any] = []

    def step(s: Scheduler, running: ScheduleBatch, last_batch: object) -> str:
        seen.append(plugin.actions)
        return "next-batch"

    assert plugin.next_batch(step, scheduler, batch, None) == "next-batch"
    assert seen[0] is not None and seen[0].preempt == ("r-old",)
    assert plugin.actions is None


def test_nothing_waiting_asks_no_planner(scheduler: Scheduler, batch: ScheduleBatch) -> None:
    link = PlannerLink(deadline_s=GENEROUS_DEADLINE_S)
    scheduler.waiting_queue.clear()
    scheduling(link).next_batch(lambda s, b, last: "decode", scheduler, batch, None)
    assert link.counters.snapshot().calls == 0


def test_unreadable_request_falls_back_and_counts(
    scheduler: Scheduler, batch: ScheduleBatch
) -> None:
    link = PlannerLink(deadline_s=GENEROUS_DEADLINE_S)
    scheduler.waiting_queue[0].time_stats = None  # type: ignore[assignment]
    plugin = scheduling(link)
    seen: list[Any] = []
    plugin.next_batch(lambda s, b, last: seen.append(plugin.actions), scheduler, batch, None)
    assert seen == [None]
    assert link.counters.snapshot().fallbacks[FallbackReason.ERROR] == 1


def test_uncontended_plan_keeps_sglang_policy_without_a_fallback(
    scheduler: Scheduler, batch: ScheduleBatch
) -> None:
    scheduler.token_to_kv_pool_allocator.free_tokens = 10_000
    link = PlannerLink(deadline_s=GENEROUS_DEADLINE_S)
    plugin = scheduling(link)
    assert plugin.plan_step(scheduler, batch.reqs) is None
    assert link.counters.snapshot().total_fallbacks == 0
    assert plugin.retraction_order(sglang_retraction_order, batch.reqs) == [0, 1]


def test_grpc_planner_gives_the_same_plan(
    scheduler: Scheduler, batch: ScheduleBatch, planner_server: PlannerServer
) -> None:
    with PlannerLink(planner_server.address, deadline_s=GENEROUS_DEADLINE_S) as link:
        actions = scheduling(link).plan_step(scheduler, batch.reqs)
    assert actions is not None
    assert (actions.resume, actions.preempt) == (("w-late", "w-fresh"), ("r-old",))


def sglang_step_outcome(
    plugin: PlannerScheduling, scheduler: Scheduler, batch: ScheduleBatch
) -> tuple[list[int], list[str], list[str]]:
    """One scheduler step through every hook, SGLang's own functions inside."""

    def step(s: Scheduler, running: ScheduleBatch, last_batch: object) -> list[int]:
        plugin.after_calc_priority(None, object(), s.waiting_queue, running)
        plugin.update_running_batch(lambda _s, b: b, s, running)
        return plugin.retraction_order(sglang_retraction_order, running.reqs)

    order = plugin.next_batch(step, scheduler, batch, None)
    return order, rids(batch.reqs), rids(scheduler.waiting_queue)


@pytest.mark.parametrize(
    "make_link",
    [
        pytest.param(lambda: PlannerLink("127.0.0.1:1", deadline_s=0.5), id="dead-planner"),
        pytest.param(lambda: PlannerLink(deadline_s=1e-9), id="slow-planner"),
    ],
)
def test_failing_planner_falls_back_to_sglang_and_loses_nothing(
    scheduler: Scheduler, batch: ScheduleBatch, make_link: Callable[[], PlannerLink]
) -> None:
    before = every_rid(batch, scheduler)
    link = make_link()
    plugin = scheduling(link)
    order, running, waiting = sglang_step_outcome(plugin, scheduler, batch)
    assert order == sglang_retraction_order(batch.reqs)
    assert running == ["r-old", "r-new"]
    assert waiting == ["w-fresh", "w-late"]
    assert every_rid(batch, scheduler) == before
    counts = link.counters.snapshot()
    assert counts.calls == 1 and counts.ok == 0
    assert (
        counts.fallbacks[FallbackReason.UNAVAILABLE] + counts.fallbacks[FallbackReason.DEADLINE]
        == 1
    )
    link.close()


@given(
    st.integers(min_value=1, max_value=6),
    st.lists(st.sampled_from([f"r{i}" for i in range(8)]), max_size=8),
)
def test_rotating_out_moves_requests_and_loses_none(n_running: int, victims: list[str]) -> None:
    allocator = TokenAllocator(free_tokens=0)
    running = [Req(f"r{i}", [0] * (i + 1)) for i in range(n_running)]
    batch = ScheduleBatch(list(running), allocator)
    waiting = [Req("w0", [0])]
    scheduler = Scheduler(list(waiting), 16, allocator)
    moved = rotate_out(scheduler, batch, tuple(victims))
    assert every_rid(batch, scheduler) == sorted(rids(running) + rids(waiting))
    assert len(batch.reqs) == n_running - moved >= 1
    gone = scheduler.waiting_queue[1:]
    assert all(not r.holds_kv for r in gone) and all(r.holds_kv for r in batch.reqs)
    assert allocator.free_tokens == sum(len(r.origin_input_ids) for r in gone)
    assert rids(gone) == [v for v in dict.fromkeys(victims) if v in rids(running)][: n_running - 1]
