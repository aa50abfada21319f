"""Recorded structures: the attributes of SGLang 0.5.23's scheduler objects
that planner.adapters.sglang reads or calls, with SGLang's semantics for them
(see adapters/sglang/engine_types.py for the source file of each)."""

from __future__ import annotations

from dataclasses import dataclass, field

# The scheduler clock (time.perf_counter()) at the step the tests plan.
NOW_S = 100.0


@dataclass
class TimeStats:
    """observability/req_time_stats.py SchedulerReqTimeStats (0.0 = unset)."""

    wait_queue_entry_time: float = 0.0
    forward_entry_time: float = 0.0
    last_decode_finish_time: float = 0.0
    # Set once, when the prefill completes: the first token's time.
    prefill_finished_time: float = 0.0


@dataclass
class Req:
    """managers/schedule_batch.py Req."""

    rid: str
    origin_input_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    time_stats: TimeStats = field(default_factory=TimeStats)
    holds_kv: bool = True


@dataclass
class TokenAllocator:
    """mem_cache/allocator/base.py BaseTokenToKVPoolAllocator: free tokens."""

    free_tokens: int

    def available_size(self) -> int:
        return self.free_tokens


def sglang_retraction_order(reqs: list[Req]) -> list[int]:
    """ScheduleBatch._get_decode_retraction_order with the default
    retraction policy: keep-first by (output length, -prompt length)."""
    return sorted(
        range(len(reqs)),
        key=lambda i: (len(reqs[i].output_ids), -len(reqs[i].origin_input_ids)),
        reverse=True,
    )


@dataclass
class ScheduleBatch:
    """managers/schedule_batch.py ScheduleBatch: release_req frees the KV a
    request holds (and asserts it held some), filter_batch(keep_indices=...)
    keeps those positions in that order."""

    reqs: list[Req]
    allocator: TokenAllocator

    _get_decode_retraction_order = staticmethod(sglang_retraction_order)

    def release_req(self, idx: int, remaing_req_count: int, offload_kv: bool = True) -> bool:
        req = self.reqs[idx]
        assert req.holds_kv, f"{req.rid} released twice"
        req.holds_kv = False
        self.allocator.free_tokens += len(req.origin_input_ids) + len(req.output_ids)
        return True

    def filter_batch(self, *, keep_indices: list[int] | None = None) -> None:
        if keep_indices is not None:
            self.reqs = [self.reqs[i] for i in keep_indices]


class SchedulePolicy:
    """managers/schedule_policy.py SchedulePolicy with policy "fcfs" and no
    priority scheduling: calc_priority leaves the queue in arrival order."""

    def calc_priority(
        self, waiting_queue: list[Req], running_batch: object = None, processed_tokens: int = 0
    ) -> None:
        return None


@dataclass
class Scheduler:
    """managers/scheduler.py Scheduler: _add_request_to_queue appends to the
    waiting queue (aggregated mode, DisaggregationMode.NULL). One step calls
    the hooked methods in SGLang's order: get_next_batch_to_run →
    policy.calc_priority (prefill path) → update_running_batch (decode path,
    here always with enough memory, so SGLang itself retracts nothing)."""

    waiting_queue: list[Req]
    page_size: int
    token_to_kv_pool_allocator: TokenAllocator
    disaggregation_mode: str = "null"
    policy: SchedulePolicy = field(default_factory=SchedulePolicy)

    def get_next_batch_to_run(
        self, running_batch: ScheduleBatch, last_batch: object
    ) -> ScheduleBatch | None:
        self.policy.calc_priority(self.waiting_queue, running_batch, processed_tokens=0)
        return self.update_running_batch(running_batch)

    def update_running_batch(self, batch: ScheduleBatch) -> ScheduleBatch | None:
        return batch

    def _add_request_to_queue(self, req: Req, is_retracted: bool = False) -> None:
        self.waiting_queue.append(req)
