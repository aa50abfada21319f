"""PlannerScheduler: vLLM's scheduler that, each step, sends the planner a
snapshot of its requests and applies the answer (preempt these running
requests, admit these waiting ones first) before vLLM's own scheduling pass;
with no usable answer that step is vLLM's own. Pipelined (the default), the
snapshot is sent right after a step is scheduled and the answer applied at
the next step if it still fits, so the call runs while the model computes;
synchronous, each step asks and waits. Selected with

    --scheduler-cls planner.adapters.vllm.scheduler.PlannerScheduler

It subclasses the scheduler vLLM itself would use: AsyncScheduler when async
scheduling is on (the GPU default), the plain Scheduler when it is off
(vLLM's CPU backend always turns it off): constructing PlannerScheduler
under a synchronous engine gives a PlannerSyncScheduler.

With PlannerSwapConnector as KV connector, preempted requests are swapped
to CPU memory instead of recomputed, and with
additional_config.planner.layer_offload the decode batch runs the planner's
layer-offload plans (layer_offload.py)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from google.protobuf import text_format
from planner.adapters.common.apply import PlanActions, accept_plan, recheck_plan
from planner.adapters.common.counters import FallbackCounters
from planner.adapters.common.link import PlannerLink, PlanPipeline
from planner.adapters.common.snapshot import (
    EngineRequestView,
    PoolSizes,
    ViewState,
    build_rotation_request,
)
from planner.adapters.common.victim_gate import VictimGate
from prometheus_client import REGISTRY
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus

from planner.v1 import common_pb2, rotation_pb2

from .connector import PlannerSwapConnector
from .decision_log import (
    APPLIED,
    FCFS,
    NO_PLAN,
    NO_VICTIM,
    OBSERVED,
    SAME_AS_ENGINE,
    DecisionLog,
)
from .layer_offload import DecodeView, LayerOffloadPlanner
from .output_deposit import OutputDeposit
from .plugin import LOGGER_NAME
from .preempted_blocks import HandsOverPreemptedBlocks
from .request_clock import RequestClock
from .settings import (
    DEFAULT_TBT_SLO_S,
    ENGINE_PREEMPTIONS_SWAP,
    PIPELINED,
    REORDER_WITH_PREEMPTION,
    PlannerSettings,
)

logger = logging.getLogger(LOGGER_NAME)
# prometheus_client's multiprocess mode (vLLM's own, when several API
# servers run): set, the adapter's counters are written where vLLM's
# /metrics reads them even without the connector.
PROMETHEUS_MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class PlannerSchedulerBase(Scheduler, HandsOverPreemptedBlocks):  # type: ignore[misc, unused-ignore]
    """The planner's part, over whichever vLLM scheduler comes next in the
    method resolution order (PlannerScheduler, PlannerSyncScheduler)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.planner_settings = PlannerSettings.from_additional_config(
            self.vllm_config.additional_config
        )
        connector = self.connector
        swap = connector if isinstance(connector, PlannerSwapConnector) else None
        multiprocess_metrics = swap is None and PROMETHEUS_MULTIPROC_ENV in os.environ
        self.planner_link = PlannerLink(
            self.planner_settings.target,
            self.planner_settings.deadline_s,
            FallbackCounters(
                REGISTRY if multiprocess_metrics else None,
                engine="vllm",
                keep_latencies=swap is not None,
            ),
            security=self.planner_settings.security,
            pipelined_send=self.planner_settings.pipelined_send,
            call_timing_log=self.planner_settings.call_timing_log,
        )
        if swap is not None:
            swap.stats.counters = self.planner_link.counters
        self.request_clock = RequestClock()
        # True while the plan's own preemptions are carried out (the
        # connector swaps those; vLLM's own as engine_preemptions says).
        self._preempting_for_plan = False
        # What the planner had this step do (None: vLLM's own step).
        self.last_actions: PlanActions | None = None
        # Pipelined: the call in flight, with the snapshot it carries (its
        # plan is checked against it, then against the engine).
        self.pipeline: PlanPipeline[tuple[list[EngineRequestView], PoolSizes]] | None = (
            PlanPipeline(self.planner_link) if self.planner_settings.planning == PIPELINED else None
        )
        # The clock of request arrival times (vLLM stamps them with time.time).
        self.now: Callable[[], float] = time.time
        self._slo = common_pb2.Slo()
        if self.planner_settings.slo_ttft_s is not None:
            self._slo.ttft_s = self.planner_settings.slo_ttft_s
        if self.planner_settings.slo_tbt_s is not None:
            self._slo.tbt_s = self.planner_settings.slo_tbt_s
        self.layer_planner = self._layer_planner()
        self.victim_gate = (
            VictimGate(
                self.planner_settings.rotation,
                self.planner_settings.slo_tbt_s or DEFAULT_TBT_SLO_S,
            )
            if self.planner_settings.apply_plans
            and self.planner_settings.reorder == REORDER_WITH_PREEMPTION
            else None
        )
        self.decision_log = (
            DecisionLog(self.planner_settings.decision_log)
            if self.planner_settings.decision_log is not None
            else None
        )
        offload = self.planner_settings.layer_offload
        self.output_deposit = (
            OutputDeposit() if offload is not None and offload.token_deposit else None
        )
        settings = self.planner_settings
        logger.info(
            "planner adapter on: %s, planner %s (deadline %.1f ms, %s), SLO TTFT %s TBT %s, "
            "rotation %s, plan order applied %s, preemption by %s, layer offload %s, metrics %s, "
            "engine limits %d tokens / %d requests per step",
            type(self).__name__,
            settings.target or "in process",
            settings.deadline_s * 1e3,
            settings.planning,
            f"{settings.slo_ttft_s} s" if settings.slo_ttft_s else "default",
            f"{settings.slo_tbt_s} s" if settings.slo_tbt_s else "default",
            text_format.MessageToString(settings.rotation, as_one_line=True) or "default"
            if settings.rotation is not None
            else "default",
            settings.reorder if settings.apply_plans else "never (observe)",
            f"swap ({swap.num_cpu_blocks} CPU blocks; vLLM's own preemptions by "
            f"{settings.engine_preemptions})"
            if swap is not None
            else "recompute",
            "on" if self.layer_planner is not None else "off",
            "vLLM KV connector stats"
            if swap is not None
            else PROMETHEUS_MULTIPROC_ENV
            if multiprocess_metrics
            else "log only (no connector, no PROMETHEUS_MULTIPROC_DIR)",
            self.max_num_scheduled_tokens,
            self.max_num_running_reqs,
        )

    def _layer_planner(self) -> LayerOffloadPlanner | None:
        offload = self.planner_settings.layer_offload
        if offload is None:
            return None
        connector = self.connector
        if not isinstance(connector, PlannerSwapConnector) or connector.layer_ledger is None:
            raise ValueError(
                "additional_config.planner.layer_offload: needs PlannerSwapConnector as the "
                "KV connector (--kv-transfer-config, see docs/adapters.md)"
            )
        ledger = connector.layer_ledger
        return LayerOffloadPlanner(
            offload,
            self.planner_settings.target,
            ledger,
            offload.gpu_block_budget or connector.num_gpu_blocks * ledger.num_layers,
            self.planner_settings.slo_tbt_s,
            security=self.planner_settings.security,
        )

    @property
    def planner_counters(self) -> FallbackCounters:
        return self.planner_link.counters

    # ---- one step -------------------------------------------------------

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        now_s = self.now()
        if self.layer_planner is not None:
            self.layer_planner.before_step(self.decode_views())
        log = self.decision_log if self.waiting else None
        # Pipelined, whether the planner would be asked now only names the
        # step in the decision log: the gate runs only for it.
        asking = (
            bool(self.waiting)
            and (self.pipeline is None or log is not None)
            and self._worth_asking(now_s)
        )
        if not self.waiting:
            actions = None
        elif self.pipeline is not None:
            actions = self._take_sent_plan(self.pipeline, now_s)
        elif asking:
            actions = self._ask_planner(now_s)
        else:
            actions = None
        if log is not None:
            engine_order = [r.request_id for r in self.waiting]
            free_before = self.kv_cache_manager.block_pool.get_num_free_blocks()
            running_before = len(self.running)
        if actions is None or actions.fcfs:
            applied = FCFS if actions is not None else NO_PLAN if asking else NO_VICTIM
            output = super().schedule(throttle_prefills)
        elif not self.planner_settings.apply_plans:
            applied = OBSERVED
            output = super().schedule(throttle_prefills)
        elif not actions.preempt and self.planner_settings.reorder == REORDER_WITH_PREEMPTION:
            applied = SAME_AS_ENGINE
            output = super().schedule(throttle_prefills)
        else:
            applied = APPLIED
            output = self._schedule_per_plan(actions, now_s, throttle_prefills)
        self.last_actions = actions if applied not in (OBSERVED, SAME_AS_ENGINE) else None
        if log is not None:
            log.step(
                now_s=now_s,
                engine_order=engine_order,
                actions=actions,
                applied=applied,
                admitted=[
                    *(r.req_id for r in output.scheduled_new_reqs),
                    *output.scheduled_cached_reqs.resumed_req_ids,
                ],
                preempted=sorted(output.preempted_req_ids or ()),
                free_blocks_before=free_before,
                running_before=running_before,
            )
        self.request_clock.mark_running((r.request_id for r in self.running), now_s)
        if (
            self.pipeline is not None
            and self.waiting
            and not self.pipeline.in_flight
            and self._worth_asking(self.now())
        ):
            self._send_for_next_step(self.pipeline)
        return output

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[int, EngineCoreOutputs]:
        outputs: dict[int, EngineCoreOutputs] = super().update_from_output(
            scheduler_output, model_runner_output
        )
        now_s = self.now()
        sampled = model_runner_output.sampled_token_ids
        self.request_clock.mark_tokens(
            (rid for i, rid in enumerate(model_runner_output.req_ids) if sampled and sampled[i]),
            now_s,
        )
        self.request_clock.forget(self.requests)
        if self.layer_planner is not None and isinstance(self.connector, PlannerSwapConnector):
            batch = [v.request_id for v in self.decode_views()]
            for t in self.connector.take_layer_timings():
                self.layer_planner.report(t.step_s, t.compute_s, t.link_blocks_per_s, batch)
            if self.output_deposit is not None:
                slo_s = self.planner_settings.slo_tbt_s or DEFAULT_TBT_SLO_S
                depositing = dict.fromkeys(self.layer_planner.placed(), slo_s)
                outputs = self.output_deposit.apply(outputs, depositing, self.requests, now_s)
        return outputs

    def decode_views(self) -> list[DecodeView]:
        """Running requests past their prompt: the batch layer offload plans."""
        return [
            DecodeView(
                r.request_id,
                r.num_computed_tokens,
                max(0, (r.max_tokens or 0) - r.num_output_tokens),
                self.output_deposit.balance(r.request_id) if self.output_deposit else 0,
            )
            for r in self.running
            if r.num_computed_tokens >= r.num_prompt_tokens
        ]

    def _preempt_request(
        self, request: Request, timestamp: float, drop_stale_output: bool = False
    ) -> None:
        # vLLM frees the blocks inside; the connector copies them out first
        # when the planner preempts (vLLM's own preemptions: as configured).
        connector = self.connector
        if isinstance(connector, PlannerSwapConnector):
            (block_ids, *_) = self.kv_cache_manager.get_block_ids(request.request_id)
            connector.preempt(
                request,
                list(block_ids),
                swap=self._preempting_for_plan
                or self.planner_settings.engine_preemptions == ENGINE_PREEMPTIONS_SWAP,
            )
        super()._preempt_request(request, timestamp, drop_stale_output)

    # ---- the planner's part ---------------------------------------------

    def _worth_asking(self, now_s: float) -> bool:
        """Whether a plan could change this step: with plans applied only
        when they preempt, only while some running request could be a
        victim (victim_gate.py); else always."""
        gate = self.victim_gate
        if gate is None:
            return True
        clock = self.request_clock
        return gate.any_victim(
            ((clock.first_token_s(r.request_id), r.num_output_tokens) for r in self.running),
            now_s,
        )

    def _ask_planner(self, now_s: float) -> PlanActions | None:
        """Synchronous: the plan for this step, waited for."""
        views = self.request_views(now_s)
        pools = self.pool_sizes()
        response = self.planner_link.plan_rotation(self._rotation_request(views, pools, now_s))
        return accept_plan(response, views, pools, self.planner_counters)

    def _send_for_next_step(self, pipeline: PlanPipeline[Any]) -> None:
        """Pipelined: the snapshot as this step leaves the engine (its
        admissions and preemptions made, its tokens counted as computed),
        sent now, answered while the model runs."""
        now_s = self.now()
        views = self.request_views(now_s)
        pools = self.pool_sizes()
        pipeline.send(self._rotation_request(views, pools, now_s), (views, pools))

    def _take_sent_plan(
        self, pipeline: PlanPipeline[tuple[list[EngineRequestView], PoolSizes]], now_s: float
    ) -> PlanActions | None:
        """Pipelined: the plan in flight, if it is there, is right for its
        snapshot and still fits the engine; else None."""
        answer = pipeline.take()
        if answer is None:
            return None
        response, (views, pools) = answer
        actions = accept_plan(response, views, pools, self.planner_counters)
        if actions is None or actions.fcfs:
            return actions
        # Since the snapshot, requests finished and arrived, tokens came.
        named = {*actions.resume, *actions.preempt}
        return recheck_plan(
            response, self.request_views(now_s, named), self.pool_sizes(), self.planner_counters
        )

    def _rotation_request(
        self, views: list[EngineRequestView], pools: PoolSizes, now_s: float
    ) -> rotation_pb2.PlanRotationRequest:
        return build_rotation_request(
            views,
            pools,
            now_s,
            slo=self._slo if self._slo.ListFields() else None,
            params=self.planner_settings.rotation,
            max_batched_tokens=self.max_num_scheduled_tokens,
            max_running_requests=self.max_num_running_reqs,
        )

    def _schedule_per_plan(
        self, actions: PlanActions, now_s: float, throttle_prefills: bool
    ) -> SchedulerOutput:
        self._preempting_for_plan = True
        try:
            for rid in actions.preempt:
                request = self.requests[rid]
                self.running.remove(request)
                self._preempt_request(request, now_s, drop_stale_output=self.requires_kv_delivery)
        finally:
            self._preempting_for_plan = False
        # Requests the plan just preempted sit out this step; those it
        # prioritizes go first, in its order, ahead of the rest.
        held = [self.requests[rid] for rid in actions.preempt]
        first = [self.requests[rid] for rid in actions.resume]
        self.waiting.remove_requests(held + first)
        self.put_first(first)
        try:
            return super().schedule(throttle_prefills)
        finally:
            self.put_first(held)

    def put_first(self, requests: list[Request]) -> None:
        """At the head of the waiting queue, in this order (vLLM's
        prepend_requests reverses the order it is given)."""
        for request in reversed(requests):
            self.waiting.prepend_request(request)

    def pool_sizes(self) -> PoolSizes:
        connector = self.connector
        return PoolSizes(
            free_gpu_blocks=self.kv_cache_manager.block_pool.get_num_free_blocks(),
            block_size_tokens=self.block_size,
            free_cpu_blocks=connector.ledger.free_cpu_blocks
            if isinstance(connector, PlannerSwapConnector)
            else None,
        )

    def request_views(self, now_s: float, only: set[str] | None = None) -> list[EngineRequestView]:
        """Running and waiting requests (only: those of these ids)."""
        views = [
            self._view(r, ViewState.RUNNING, now_s)
            for r in self.running
            if only is None or r.request_id in only
        ]
        connector = self.connector
        for r in self.waiting:
            if only is not None and r.request_id not in only:
                continue
            if r.status != RequestStatus.PREEMPTED:
                state = ViewState.WAITING
            elif isinstance(connector, PlannerSwapConnector) and connector.ledger.swapped(
                r.request_id
            ):
                state = ViewState.SWAPPED
            else:
                state = ViewState.PREEMPTED
            views.append(self._view(r, state, now_s))
        return views

    def _view(self, r: Request, state: ViewState, now_s: float) -> EngineRequestView:
        rid = r.request_id
        gpu_blocks = 0
        cpu_blocks = 0
        if state is ViewState.RUNNING:
            gpu_blocks = len(self.kv_cache_manager.get_block_ids(rid)[0])
        elif state is ViewState.SWAPPED and isinstance(self.connector, PlannerSwapConnector):
            swapped = self.connector.ledger.swapped(rid)
            cpu_blocks = len(swapped.cpu_block_ids) if swapped is not None else 0
        arrival_s = min(r.arrival_time, now_s)
        run_start_s = self.request_clock.run_start_s(rid)
        if state is ViewState.RUNNING and run_start_s is None:
            run_start_s = arrival_s
        return EngineRequestView(
            request_id=rid,
            state=state,
            prompt_tokens=r.num_prompt_tokens,
            computed_tokens=r.num_computed_tokens,
            output_tokens=r.num_output_tokens,
            gpu_blocks=gpu_blocks,
            cpu_blocks=cpu_blocks,
            arrival_s=arrival_s,
            run_start_s=run_start_s if state is ViewState.RUNNING else None,
            last_token_s=self.request_clock.last_token_s(rid),
            first_token_s=self.request_clock.first_token_s(rid),
        )

    def shutdown(self) -> None:
        self.planner_link.close()
        if self.decision_log is not None:
            self.decision_log.close()
        if self.layer_planner is not None:
            self.layer_planner.close()
        super().shutdown()


class PlannerScheduler(PlannerSchedulerBase, AsyncScheduler):  # type: ignore[misc, unused-ignore]
    """The name to give --scheduler-cls. Over AsyncScheduler; under an engine
    whose async scheduling is off, constructing it gives a
    PlannerSyncScheduler (vLLM's engine and its scheduler must agree)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        if (
            cls is PlannerScheduler
            and vllm_config is not None
            and not vllm_config.scheduler_config.async_scheduling
        ):
            # Not a PlannerScheduler: Python does not call __init__ again.
            return PlannerSyncScheduler(*args, **kwargs)
        return super().__new__(cls)


class PlannerSyncScheduler(PlannerSchedulerBase):
    """Over vLLM's synchronous Scheduler."""
