"""The slice of SGLang's objects the plugin reads and calls, as Protocols.

Each mirrors a class of SGLang 0.5.23; only the attributes listed here are
touched, so these are also the recorded structures the tests build:
- ``ReqTimeStats``: ``sglang/srt/observability/req_time_stats.py``
  ``SchedulerReqTimeStats`` (``time.perf_counter()`` stamps, 0.0 = unset).
- ``Req``: ``sglang/srt/managers/schedule_batch.py`` ``Req``.
- ``ScheduleBatch``: same file, ``ScheduleBatch`` (``reqs``, ``release_req``,
  ``filter_batch``).
- ``TokenAllocator``: ``sglang/srt/mem_cache/allocator/base.py``
  ``BaseTokenToKVPoolAllocator`` (``available_size`` in tokens).
- ``Scheduler``: ``sglang/srt/managers/scheduler.py`` ``Scheduler``.
- ``DeviceKVPool``: ``sglang/srt/mem_cache/memory_pool.py``
  ``MHATokenToKVPool`` (per-layer ``(tokens, H_kv, D)`` K and V buffers).
- ``HostKVPool``: ``sglang/srt/mem_cache/pool_host/mha.py``
  ``MHATokenToKVPoolHost`` (``kv_buffer`` of layout ``layer_first``
  ``(2, L, tokens, H_kv, D)`` or ``page_first`` ``(2, tokens, L, H_kv, D)``;
  ``alloc``/``free`` from ``pool_host/base.py`` ``HostKVCache``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch


class ReqTimeStats(Protocol):
    wait_queue_entry_time: float
    forward_entry_time: float
    last_decode_finish_time: float
    # Set once when the prefill completes (the first token in unified mode).
    prefill_finished_time: float


class Req(Protocol):
    rid: str
    origin_input_ids: Sequence[int]
    output_ids: Sequence[int]
    time_stats: ReqTimeStats


class ScheduleBatch(Protocol):
    reqs: list[Req]

    def release_req(self, idx: int, remaing_req_count: int, offload_kv: bool = True) -> bool: ...

    def filter_batch(self, *, keep_indices: list[int] | None = None) -> None: ...


class TokenAllocator(Protocol):
    def available_size(self) -> int: ...


class Scheduler(Protocol):
    waiting_queue: list[Req]
    page_size: int
    token_to_kv_pool_allocator: TokenAllocator

    def _add_request_to_queue(self, req: Req, is_retracted: bool = False) -> None: ...


class DeviceKVPool(Protocol):
    k_buffer: list[torch.Tensor]
    v_buffer: list[torch.Tensor]


class HostKVPool(Protocol):
    kv_buffer: torch.Tensor
    layout: str

    def alloc(self, need_size: int) -> torch.Tensor | None: ...

    def free(self, indices: torch.Tensor) -> int: ...

    def backup_from_device_all_layer(
        self,
        device_pool: DeviceKVPool,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: str,
    ) -> None: ...

    def load_to_device_per_layer(
        self,
        device_pool: DeviceKVPool,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        layer_id: int,
        io_backend: str,
    ) -> None: ...
