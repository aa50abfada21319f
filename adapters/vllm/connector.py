"""PlannerSwapConnector: a vLLM V1 KV connector that swaps a preempted
request's KV out to CPU memory and back in when it resumes, where V1 alone
would recompute it. Loaded by module path:

    --kv-transfer-config '{"kv_connector": "PlannerSwapConnector",
      "kv_connector_module_path": "planner.adapters.vllm.connector",
      "kv_role": "kv_both", "kv_connector_extra_config": {"num_cpu_blocks": 4096}}'

The scheduler side learns of preemptions from PlannerScheduler (vLLM frees a
preempted request's blocks inside its scheduler, before any connector hook),
so this connector needs that scheduler. The worker copies with
planner.kernels' reference block copy: D2H in handle_preemptions (before
the model runner zeroes reused blocks), H2D in start_load_kv.

With additional_config.planner.layer_offload set, it also carries out the
planner's layer-offload plans: offloaded layers' KV lives in CPU memory and
is fetched per layer in wait_for_layer_load and saved back in save_kv_layer
(layer_ledger.py, layer_fetch.py); each step's per-layer timings go back to
the scheduler as kv_connector_worker_meta."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from planner.kernels.transfer_ref import copy_blocks_reference
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
)
from vllm.platforms import current_platform
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from .layer_fetch import LayerFetcher, LayerTimings
from .layer_ledger import LayerOffloadLedger, LayerStep, ScheduledRequest
from .plugin import LOGGER_NAME
from .preempted_blocks import HandsOverPreemptedBlocks
from .settings import PlannerSettings
from .stats import PlannerPromMetrics, PlannerStats, StatsTaker
from .swap_ledger import StepCopies, SwapLedger

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

NUM_CPU_BLOCKS_KEY = "num_cpu_blocks"
# vLLM's CPU backend reserves one more core per worker for any KV connector
# (for NIXL's transfer threads); this connector copies on the worker's own
# thread and needs none.
RESERVED_CPU_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"
logger = logging.getLogger(LOGGER_NAME)


@dataclass(frozen=True)
class SwapMetadata(KVConnectorMetadata):  # type: ignore[misc, unused-ignore]
    copies: StepCopies
    layers: LayerStep = field(default_factory=LayerStep)


def _num_cpu_blocks(extra: dict[str, Any]) -> int:
    value = extra.get(NUM_CPU_BLOCKS_KEY)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(
            f"kv_connector_extra_config.{NUM_CPU_BLOCKS_KEY}: must be an integer > 0, got {value!r}"
        )
    return value


def block_major(cache: torch.Tensor, num_gpu_blocks: int) -> torch.Tensor:
    """A view of one layer's KV cache with the block index first: vLLM
    backends use (num_blocks, ...) or (2, num_blocks, ...)."""
    if cache.shape[0] == num_gpu_blocks:
        return cache
    if cache.dim() > 1 and cache.shape[0] == 2 and cache.shape[1] == num_gpu_blocks:
        return cache.movedim(1, 0)
    raise ValueError(
        f"cannot find the block dimension of a KV cache of shape {tuple(cache.shape)} "
        f"with {num_gpu_blocks} blocks"
    )


class PlannerSwapConnector(KVConnectorBase_V1):  # type: ignore[misc, unused-ignore]
    _cache_hit_source = CacheHitSource.HOST

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        self.num_cpu_blocks = _num_cpu_blocks(extra)
        self.block_size_tokens = vllm_config.cache_config.block_size
        self.num_gpu_blocks = kv_cache_config.num_blocks
        self.ledger = SwapLedger(self.num_cpu_blocks, self.block_size_tokens)
        self._local_tokens: dict[str, int] = {}
        # Worker side: per layer, the block-major GPU view and its CPU pool.
        self.gpu_layers: dict[str, torch.Tensor] = {}
        self.cpu_layers: dict[str, torch.Tensor] = {}
        # Layer offload, when on: the planner's layer l is the first KV cache
        # group's l-th layer in model order.
        self.layer_offload = PlannerSettings.from_additional_config(
            vllm_config.additional_config
        ).layer_offload
        groups = kv_cache_config.kv_cache_groups
        self.layer_names = sorted(groups[0].layer_names, key=_model_order) if groups else []
        self.num_offload_cpu_blocks = (
            self.layer_offload.num_cpu_blocks or self.num_gpu_blocks
            if self.layer_offload is not None
            else 0
        )
        self.layer_ledger: LayerOffloadLedger | None = (
            LayerOffloadLedger(
                len(self.layer_names), self.num_offload_cpu_blocks, self.block_size_tokens
            )
            if self.layer_offload is not None and self.layer_names
            else None
        )
        self.layer_fetcher: LayerFetcher | None = None
        # The last step's timings from the workers (scheduler side).
        self._timings: list[LayerTimings] = []
        # What goes to vLLM's metrics each step (scheduler side).
        self.stats = StatsTaker(self.ledger)
        if role == KVConnectorRole.SCHEDULER:
            _require_planner_scheduler(vllm_config)
            if current_platform.is_cpu() and RESERVED_CPU_ENV not in os.environ:
                logger.warning(
                    "vLLM's CPU backend reserves an extra core for a KV connector "
                    "(%s unset); PlannerSwapConnector needs none. On a small machine that "
                    "core is taken from the model's threads (measured on 2 cores: +40%% "
                    "wall time, +150%% worker CPU). Set %s to the workers per node "
                    "(1 without tensor parallelism), what vLLM reserves without a connector.",
                    RESERVED_CPU_ENV,
                    RESERVED_CPU_ENV,
                )

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> PlannerStats:
        return PlannerStats(data=data) if data is not None else PlannerStats()

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> PlannerPromMetrics:
        return PlannerPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def get_kv_connector_stats(self) -> PlannerStats | None:
        # Scheduler side only: the workers' copies are counted where they
        # are planned.
        return self.stats.take() if self.role == KVConnectorRole.SCHEDULER else None

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        # Layer offload's per-layer hooks cannot run inside a captured CUDA
        # graph. vLLM asks with kv_connector_extra_config only, which does
        # not say whether layer offload (additional_config) is on: always ask.
        return True

    @property
    def requires_kv_delivery(self) -> bool:
        # A swap is a cache: a dropped one is recomputed, never lost.
        return False

    # ---- scheduler side -------------------------------------------------

    def preempt(self, request: Request, gpu_block_ids: list[int], swap: bool) -> bool:
        """Called by PlannerScheduler just before vLLM frees a preempted
        request's blocks: with swap, their KV is copied out (True; False
        when the CPU pool is full); without, vLLM recomputes the request as
        it would without this connector. Either way an older CPU copy is
        forgotten."""
        if swap:
            swapped = self.ledger.swap_out(
                request.request_id, gpu_block_ids, request.num_computed_tokens
            )
        else:
            self.ledger.drop(request.request_id)
            swapped = False
        self.preempt_layers(request, gpu_block_ids, swapped)
        return swapped

    def preempt_layers(self, request: Request, gpu_block_ids: list[int], swapped: bool) -> None:
        """At a preemption, before the swap-out copies run: a swapped
        request's offloaded layers come back into its GPU blocks first; a
        recomputed one's are dropped."""
        if self.layer_ledger is None:
            return
        if swapped:
            self.layer_ledger.preempt(
                request.request_id, gpu_block_ids, request.num_computed_tokens
            )
        else:
            self.layer_ledger.drop(request.request_id)

    def take_layer_timings(self) -> list[LayerTimings]:
        """Per-layer timings the workers reported since the last call."""
        timings, self._timings = self._timings, []
        return timings

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        tokens = self.ledger.loadable_tokens(
            request.request_id, request.num_tokens, num_computed_tokens
        )
        if tokens:
            # The local hit the load starts after, for update_state_after_alloc
            # (the request's own count is not updated by then).
            self._local_tokens[request.request_id] = num_computed_tokens
        return tokens, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        if num_external_tokens <= 0:
            return
        (gpu_block_ids, *_) = blocks.get_block_ids()
        local = self._local_tokens.pop(request.request_id)
        self.ledger.swap_in(request.request_id, list(gpu_block_ids), local, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        if self.layer_ledger is None:
            return SwapMetadata(self.ledger.take_step())
        manager = self._kv_cache_manager
        assert manager is not None, "vLLM binds the KV cache manager before scheduling"
        for rid, start in _computed_tokens(scheduler_output):
            (gpu_block_ids, *_) = manager.get_block_ids(rid)
            self.layer_ledger.schedule(
                ScheduledRequest(
                    rid, start, scheduler_output.num_scheduled_tokens[rid], tuple(gpu_block_ids)
                )
            )
        return SwapMetadata(self.ledger.take_step(), self.layer_ledger.take_step())

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, LayerTimings):
            self._timings.append(meta)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        self.ledger.drop(request.request_id)
        if self.layer_ledger is not None:
            self.layer_ledger.drop(request.request_id)
        self._local_tokens.pop(request.request_id, None)
        return False, None

    # ---- worker side ----------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        for name, cache in kv_caches.items():
            gpu = block_major(cache, self.num_gpu_blocks)
            self.gpu_layers[name] = gpu
            self.cpu_layers[name] = torch.zeros(
                (self.num_cpu_blocks, *gpu.shape[1:]),
                dtype=gpu.dtype,
                device="cpu",
                pin_memory=gpu.is_cuda,
            )
        if self.layer_offload is not None:
            self.layer_fetcher = LayerFetcher(
                self.layer_names,
                {name: self.gpu_layers[name] for name in self.layer_names},
                {
                    name: torch.zeros(
                        (self.num_offload_cpu_blocks, *self.gpu_layers[name].shape[1:]),
                        dtype=self.gpu_layers[name].dtype,
                        device="cpu",
                        pin_memory=self.gpu_layers[name].is_cuda,
                    )
                    for name in self.layer_names
                },
            )

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        assert isinstance(kv_connector_metadata, SwapMetadata)
        if self.layer_fetcher is not None:
            self.layer_fetcher.begin_step(kv_connector_metadata.layers)
            self.layer_fetcher.restore()
        out = kv_connector_metadata.copies.swap_out
        if len(out):
            src, dst = torch.tensor(out.src), torch.tensor(out.dst)
            for name, gpu in self.gpu_layers.items():
                copy_blocks_reference(gpu, self.cpu_layers[name], src, dst)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, SwapMetadata)
        into = meta.copies.swap_in
        if len(into):
            src, dst = torch.tensor(into.src), torch.tensor(into.dst)
            for name, gpu in self.gpu_layers.items():
                copy_blocks_reference(self.cpu_layers[name], gpu, src, dst)

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Swap-in copies every layer before the forward begins; layer offload
        # fetches this layer's offloaded KV now, just before its attention.
        if self.layer_fetcher is not None:
            self.layer_fetcher.wait_for_layer_load(layer_name)

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        # Swap-out copies whole blocks at preemption, not per layer; layer
        # offload saves what this step wrote to an offloaded layer.
        if self.layer_fetcher is not None:
            self.layer_fetcher.save_kv_layer(layer_name)

    def wait_for_save(self) -> None:
        return

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        return self.layer_fetcher.take_timings() if self.layer_fetcher is not None else None


def _require_planner_scheduler(vllm_config: VllmConfig) -> None:
    """vLLM frees a preempted request's blocks inside its scheduler before any
    connector hook runs, so only PlannerScheduler can have them copied out
    first; under another scheduler this connector would do nothing."""
    scheduler_cls = vllm_config.scheduler_config.get_scheduler_cls()
    if not (
        isinstance(scheduler_cls, type) and issubclass(scheduler_cls, HandsOverPreemptedBlocks)
    ):
        raise ValueError(
            "--kv-transfer-config PlannerSwapConnector needs --scheduler-cls "
            "planner.adapters.vllm.scheduler.PlannerScheduler (vLLM frees a preempted "
            f"request's KV inside its scheduler); the scheduler is {scheduler_cls!r}"
        )


def _computed_tokens(scheduler_output: SchedulerOutput) -> list[tuple[str, int]]:
    """(request id, tokens whose KV exists before this step) of every
    request the step runs."""
    cached = scheduler_output.scheduled_cached_reqs
    pairs = [(r.req_id, r.num_computed_tokens) for r in scheduler_output.scheduled_new_reqs]
    pairs.extend(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
    return pairs


def _model_order(layer_name: str) -> tuple[int, ...]:
    """The sort key of model order: "model.layers.12.self_attn.attn" ->
    (12,), so "layers.10" comes after "layers.9"."""
    return tuple(int(part) for part in layer_name.split(".") if part.isdigit())
