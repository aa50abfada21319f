"""A request inside the simulated engine."""

from __future__ import annotations

import enum
import math

from planner.replay.records import RequestOutcome


class Phase(enum.IntEnum):
    NOT_ARRIVED = 0
    QUEUED = 1  # waiting for admission (new, or preempted by recompute)
    RUNNING = 2  # KV on the GPU: prefilling or decoding
    ROTARY = 3  # preempted by swap: KV in CPU memory
    IN_TRANSIT = 4  # being swapped in this iteration; runs from the next one
    FINISHED = 5
    REJECTED = 6  # needs more KV than the whole GPU pool: never queued


class SimRequest:
    """Mutable per-request state. KV accounting: a prefill over all known
    tokens (prompt plus those generated so far) emits the next token; each
    decode step feeds the newest token (its KV is written) and emits one."""

    __slots__ = (
        "admitted_at_s",
        "arrival_s",
        "cpu_blocks",
        "generated",
        "gpu_blocks",
        "id",
        "index",
        "kv_tokens",
        "last_progress_s",
        "outcome",
        "output_tokens",
        "phase",
        "prefill_target",
        "prompt_tokens",
        "run_start_s",
        "slo_tbt_s",
        "slo_ttft_s",
        "synced_blocks",
    )

    def __init__(
        self,
        index: int,
        id: str,
        *,
        arrival_s: float,
        prompt_tokens: int,
        output_tokens: int,
        slo_ttft_s: float,
        slo_tbt_s: float,
    ) -> None:
        self.index = index
        self.id = id
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.slo_ttft_s = slo_ttft_s
        self.slo_tbt_s = slo_tbt_s
        self.phase = Phase.NOT_ARRIVED
        self.generated = 0
        self.kv_tokens = 0
        self.prefill_target = prompt_tokens
        self.gpu_blocks = 0
        self.cpu_blocks = 0
        self.synced_blocks = 0
        self.run_start_s = math.nan
        self.admitted_at_s = math.nan
        self.last_progress_s = math.nan
        self.outcome = RequestOutcome(
            id=id,
            arrival_s=arrival_s,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            slo_ttft_s=slo_ttft_s,
            slo_tbt_s=slo_tbt_s,
        )

    @property
    def prefilling(self) -> bool:
        return self.kv_tokens < self.prefill_target

    def blocks_for(self, tokens: int, block_size: int) -> int:
        return -(-tokens // block_size)

    def full_blocks(self, block_size: int) -> int:
        return min(self.kv_tokens // block_size, self.gpu_blocks)
