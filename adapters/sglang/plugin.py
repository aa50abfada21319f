"""The SGLang plugin: hooks on SGLang's scheduler, registered through
``sglang.srt.plugins.hook_registry.HookRegistry`` by the ``sglang.srt.plugins``
entry point ``planner`` (``register`` below).

Once per scheduler step (``Scheduler.get_next_batch_to_run``) with requests
waiting, the planner is asked for a rotation plan; the step's other hooks
read that plan:
- ``SchedulePolicy.calc_priority``: the waiting queue starts with the plan's
  prioritized requests, in its order;
- ``ScheduleBatch._get_decode_retraction_order``: when SGLang must retract
  under memory pressure, it retracts the plan's preempted requests first;
- ``Scheduler.update_running_batch``: after SGLang's own update, the plan's
  preempted requests leave the decode batch for the waiting queue, making
  room for the requests it prioritized (rotation).
With no plan (planner late, down, or wrong: counted by the link) or an
uncontended one, every hook leaves SGLang's own decision untouched."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from planner.v1 import rotation_pb2

from ..common.apply import PlanActions, accept_plan
from ..common.counters import FallbackReason
from ..common.link import PlannerLink
from ..common.snapshot import build_rotation_request
from .config import PluginConfig
from .engine_types import Req, ScheduleBatch, Scheduler
from .ordering import planned_retractions, retraction_order, waiting_order
from .snapshot import pool_sizes, request_views

_SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
NEXT_BATCH_TARGET = f"{_SCHEDULER}.get_next_batch_to_run"
UPDATE_RUNNING_TARGET = f"{_SCHEDULER}.update_running_batch"
CALC_PRIORITY_TARGET = "sglang.srt.managers.schedule_policy.SchedulePolicy.calc_priority"
RETRACTION_ORDER_TARGET = (
    "sglang.srt.managers.schedule_batch.ScheduleBatch._get_decode_retraction_order"
)


@dataclass(frozen=True, slots=True)
class Hook:
    target: str
    # SGLang's HookType member name: "AROUND" or "AFTER".
    kind: str
    fn: Callable[..., Any]


class PlannerScheduling:
    """The plugin's whole state: the link and the plan of the current step.
    ``template`` carries the deployment's RotationParams, SLO and profile."""

    def __init__(
        self,
        link: PlannerLink,
        clock: Callable[[], float] = time.perf_counter,
        template: rotation_pb2.PlanRotationRequest | None = None,
    ) -> None:
        self.link = link
        self.clock = clock
        self.template = template or rotation_pb2.PlanRotationRequest()
        self.actions: PlanActions | None = None
        self.rotated = 0

    def plan_step(self, scheduler: Scheduler, running: list[Req]) -> PlanActions | None:
        now_s = self.clock()
        views = request_views(running, scheduler.waiting_queue, scheduler.page_size, now_s)
        pools = pool_sizes(scheduler)
        request = build_rotation_request(
            views,
            pools,
            now_s,
            params=self.template.params if self.template.HasField("params") else None,
            slo=self.template.slo if self.template.HasField("slo") else None,
            profile=self.template.profile if self.template.HasField("profile") else None,
        )
        response = self.link.plan_rotation(request)
        actions = accept_plan(response, views, pools, self.link.counters)
        self.actions = None if actions is None or actions.fcfs else actions
        return self.actions

    # Hooks. Each takes exactly what SGLang's HookRegistry passes.

    def next_batch(
        self,
        original: Callable[..., Any],
        scheduler: Scheduler,
        running_batch: ScheduleBatch,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        self.actions = None
        if scheduler.waiting_queue:
            try:
                self.plan_step(scheduler, list(running_batch.reqs))
            except Exception:
                # A request this plugin cannot read must not stop SGLang.
                self.actions = None
                self.link.counters.record_fallback(FallbackReason.ERROR)
        try:
            return original(scheduler, running_batch, *args, **kwargs)
        finally:
            self.actions = None

    def after_calc_priority(
        self, result: None, policy: object, waiting_queue: list[Req], *args: Any, **kwargs: Any
    ) -> None:
        if self.actions is None or not self.actions.resume:
            return
        order = waiting_order([r.rid for r in waiting_queue], self.actions.resume)
        waiting_queue[:] = [waiting_queue[i] for i in order]

    def retraction_order(
        self, original: Callable[[list[Req]], list[int]], reqs: list[Req]
    ) -> list[int]:
        keep_order = original(reqs)
        if self.actions is None or not self.actions.preempt:
            return keep_order
        return retraction_order(keep_order, [r.rid for r in reqs], self.actions.preempt)

    def update_running_batch(
        self, original: Callable[..., Any], scheduler: Scheduler, batch: ScheduleBatch
    ) -> Any:
        result = original(scheduler, batch)
        actions = self.actions
        if result is None or actions is None or not (actions.preempt and actions.resume):
            return result
        if _disaggregation(scheduler) != "null":
            # Retraction there backs KV up to the host or aborts; not ours to trigger.
            return result
        self.rotated += rotate_out(scheduler, result, actions.preempt)
        return result

    def hooks(self) -> list[Hook]:
        return [
            Hook(NEXT_BATCH_TARGET, "AROUND", self.next_batch),
            Hook(CALC_PRIORITY_TARGET, "AFTER", self.after_calc_priority),
            Hook(RETRACTION_ORDER_TARGET, "AROUND", self.retraction_order),
            Hook(UPDATE_RUNNING_TARGET, "AROUND", self.update_running_batch),
        ]


def _disaggregation(scheduler: Scheduler) -> str:
    mode = getattr(scheduler, "disaggregation_mode", "null")
    return str(getattr(mode, "value", mode))


def rotate_out(scheduler: Scheduler, batch: ScheduleBatch, victims: tuple[str, ...]) -> int:
    """Retract the planner's victims from the decode batch the way SGLang's
    ``retract_decode`` does (release KV, filter, requeue as retracted),
    keeping at least one request. Returns how many left."""
    chosen = planned_retractions([r.rid for r in batch.reqs], victims)
    if not chosen:
        return 0
    gone = set(chosen)
    keep = [i for i in range(len(batch.reqs)) if i not in gone]
    retracted: list[Req] = []
    for idx in chosen:
        # SGLang's own retraction passes how many requests stay.
        batch.release_req(idx, len(keep))
        retracted.append(batch.reqs[idx])
    batch.filter_batch(keep_indices=keep)
    for req in retracted:
        scheduler._add_request_to_queue(req, is_retracted=True)
    return len(retracted)


def register() -> None:
    """The ``sglang.srt.plugins`` entry point. SGLang runs it in every
    process before applying hooks."""
    from sglang.srt.plugins.hook_registry import (  # noqa: PLC0415 - sglang is optional
        HookRegistry,
        HookType,
    )

    config = PluginConfig.from_env(os.environ)
    if not config.enabled:
        return
    link = PlannerLink(target=config.target, deadline_s=config.deadline_s, security=config.security)
    scheduling = PlannerScheduling(link)
    for hook in scheduling.hooks():
        HookRegistry.register(hook.target, hook.fn, HookType[hook.kind])
