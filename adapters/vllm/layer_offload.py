"""Scheduler side of layer offload: when the decode batch needs a plan (none
yet, the batch changed, the window expired, or the planner's controller
asked after a ReportStep), ask OffloadService.PlanLayerOffload and hand each
request's offloaded layers to the connector's ledger; after each step, send
the workers' per-layer timings with ReportStep. With no plan every layer
stays resident (vLLM's own behaviour). Plain Python, no vLLM."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from planner.adapters.common.counters import FallbackCounters
from planner.adapters.common.offload_link import OffloadLink
from planner.adapters.common.security import ChannelSecurity

from planner.v1 import common_pb2, offload_pb2

from .layer_ledger import LayerOffloadLedger
from .layer_offload_settings import LayerOffloadSettings

RECENT_REPORTS = 256


@dataclass(frozen=True, slots=True)
class DecodeView:
    request_id: str
    # Tokens whose KV is written.
    num_tokens: int
    # Tokens it will still generate (0: unknown).
    remaining_tokens: int
    # Tokens held in its Token-Deposit.
    deposited_tokens: int = 0


class LayerOffloadPlanner:
    def __init__(
        self,
        settings: LayerOffloadSettings,
        target: str | None,
        ledger: LayerOffloadLedger,
        gpu_block_budget: int,
        slo_tbt_s: float | None,
        *,
        security: ChannelSecurity | None = None,
    ) -> None:
        self.settings = settings
        self.ledger = ledger
        self.gpu_block_budget = gpu_block_budget
        self.slo_tbt_s = slo_tbt_s
        self.link = OffloadLink(
            target,
            settings.deadline_s,
            FallbackCounters(engine="vllm-offload-plan"),
            FallbackCounters(engine="vllm-offload-report"),
            security=security,
        )
        self.plan: offload_pb2.OffloadPlan | None = None
        self.plans = 0
        self.step = 0
        # The latest ReportStep exchanges, oldest first (for logs and tests).
        self.reports: deque[
            tuple[offload_pb2.ReportStepRequest, offload_pb2.ReportStepResponse]
        ] = deque(maxlen=RECENT_REPORTS)
        self._replan = True
        self._plan_batch: frozenset[str] = frozenset()

    def before_step(self, decode: Sequence[DecodeView]) -> None:
        """Before the step is scheduled: re-plan when needed."""
        self.step += 1
        ids = frozenset(v.request_id for v in decode)
        expired = self.plan is not None and self.step >= self.plan.expiry_step
        if not (self._replan or expired or ids != self._plan_batch):
            return
        self._plan_batch = ids
        if not decode:
            self._install(None)
            return
        response = self.link.plan_layer_offload(self._request(decode))
        self._install(response.plan if response is not None else None)

    def report(
        self,
        step_s: float,
        layer_compute_s: Sequence[float],
        link_blocks_per_s: float | None,
        batch_ids: Sequence[str],
    ) -> None:
        """One step's measurements, to the planner's adaptive controller."""
        if self.plan is None or not step_s > 0:
            return
        request = offload_pb2.ReportStepRequest(
            engine_id=self.settings.engine_id,
            step=self.step,
            observed_step_s=step_s,
            batch_ids=list(batch_ids),
            observed_layer_compute_s=list(layer_compute_s),
            observed_link_blocks_per_s=link_blocks_per_s or 0.0,
        )
        decision = self.link.report_step(request)
        if decision is not None:
            self.reports.append((request, decision))
            if decision.replan:
                self._replan = True

    def placed(self) -> list[str]:
        """The requests the plan in force runs (none without a plan)."""
        return [p.id for p in self.plan.placements] if self.plan is not None else []

    def _install(self, plan: offload_pb2.OffloadPlan | None) -> None:
        self.plan = plan
        self._replan = plan is None
        if plan is None:
            self.ledger.set_targets({})
            return
        self.plans += 1
        self.ledger.set_targets({p.id: list(p.offloaded_layers) for p in plan.placements})

    def _request(self, decode: Sequence[DecodeView]) -> offload_pb2.PlanLayerOffloadRequest:
        request = offload_pb2.PlanLayerOffloadRequest(
            engine_id=self.settings.engine_id,
            step=self.step,
            requests=[
                offload_pb2.DecodeRequest(
                    id=v.request_id,
                    num_tokens=max(1, v.num_tokens),
                    remaining_tokens=max(0, v.remaining_tokens),
                    deposited_tokens=v.deposited_tokens,
                )
                for v in decode
            ],
            layer_compute_s=[self.settings.layer_compute_s] * self.ledger.num_layers,
            link_blocks_per_s=self.settings.link_blocks_per_s,
            gpu_block_budget=self.gpu_block_budget,
            block_size_tokens=self.ledger.block_size_tokens,
        )
        if self.slo_tbt_s is not None:
            request.slo.CopyFrom(common_pb2.Slo(tbt_s=self.slo_tbt_s))
        return request

    def close(self) -> None:
        self.link.close()
