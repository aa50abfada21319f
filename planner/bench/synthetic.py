"""Seeded synthetic rotation snapshots: a realistic mix under contention.

About half the tracked requests RUNNING, a third WAITING, the rest ROTARY;
running and rotary ones with a token count and first-token time, some with
TPOT slack to spare and some behind their SLO;
prompt lengths log-normal (median ~600 tokens), timestamps spread over the
last minutes; free GPU blocks a fraction of what WAITING and ROTARY requests
need, so Largest-VLT-First runs (not the no-contention FCFS fallback) and,
with the paper's transfer budget of 2400 blocks, preempts running requests.

Counts-level by default; block-level gives every block an id, handed out
from fragmented pools (runs of a few consecutive ids in shuffled order), as
an allocator's free list looks after some churn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from planner.domain.requests import (
    BlockPools,
    RequestState,
    RequestTable,
    Slo,
    Snapshot,
    TrackedRequest,
)
from planner.domain.rotation import RotationInputs, RotationParams
from planner.profiles import HARDWARE_PROFILES, MODEL_PROFILES


@dataclass(frozen=True, slots=True)
class WorkloadMix:
    """What a synthetic snapshot looks like; the defaults are the benchmark's."""

    running_fraction: float = 0.50
    waiting_fraction: float = 0.35  # the rest are ROTARY
    # Free GPU blocks as a fraction of the blocks WAITING and ROTARY need.
    free_fraction: float = 0.25
    transfer_budget_blocks: int = 2400
    block_size_tokens: int = 16
    now_s: float = 3600.0
    # RUNNING requests started within this window; ROTARY ones arrived in it.
    horizon_s: float = 300.0
    # WAITING requests arrived within this window.
    queue_window_s: float = 120.0
    # ROTARY requests produced their last token within this window.
    rotary_window_s: float = 30.0
    prompt_median_tokens: float = 600.0
    prompt_sigma: float = 0.9
    max_prompt_tokens: int = 16_384
    max_generated_tokens: int = 1024
    # Fraction of requests that carry their own (tighter) SLO.
    custom_slo_fraction: float = 0.1
    custom_slo: Slo = field(default_factory=lambda: Slo(ttft_s=2.0, tbt_s=0.05))
    slo: Slo = field(default_factory=Slo)
    last_iteration_s: float = 0.05
    model_name: str = "llama-3-8b"
    hardware_name: str = "h100-sxm-80gb"
    # Length of the runs of consecutive ids the block pools are shuffled in.
    fragment_blocks: int = 8
    # Running and rotary requests made their tokens at a mean time per token
    # drawn from this range, so some have TPOT slack to spare and some have
    # lost their SLO (with the 100 ms TBT SLO).
    tpot_range_s: tuple[float, float] = (0.03, 0.15)


@dataclass(frozen=True, slots=True)
class SyntheticSnapshot:
    """One generated engine iteration, before it becomes a domain Snapshot or
    a proto request."""

    seed: int
    mix: WorkloadMix
    requests: tuple[TrackedRequest, ...]
    free_gpu_blocks: int
    free_cpu_blocks: int
    pools: BlockPools | None

    @property
    def block_level(self) -> bool:
        return self.pools is not None

    def blocks_needed(self) -> int:
        """Blocks WAITING and ROTARY requests need (the contention check's sum)."""
        return sum(_need(r) for r in self.requests)

    def snapshot(self) -> Snapshot:
        table = RequestTable.from_requests(
            self.requests, self.mix.block_size_tokens, block_level=self.block_level
        )
        return Snapshot(
            now_s=self.mix.now_s,
            free_gpu_blocks=self.free_gpu_blocks,
            requests=table,
            block_size_tokens=self.mix.block_size_tokens,
            free_cpu_blocks=self.free_cpu_blocks,
            last_iteration_s=self.mix.last_iteration_s,
            pools=self.pools,
        )

    def inputs(self) -> RotationInputs:
        mix = self.mix
        return RotationInputs(
            params=RotationParams(transfer_budget_blocks=mix.transfer_budget_blocks),
            slo=mix.slo,
            model=MODEL_PROFILES[mix.model_name],
            hardware=HARDWARE_PROFILES[mix.hardware_name],
        )


def _need(r: TrackedRequest) -> int:
    if r.state == RequestState.WAITING:
        return r.prompt_blocks + 1
    if r.state == RequestState.ROTARY:
        return r.cpu_blocks
    return 0


def _states(n: int, mix: WorkloadMix, rng: np.random.Generator) -> list[RequestState]:
    waiting = max(round(n * mix.waiting_fraction), 1)
    running = min(round(n * mix.running_fraction), n - waiting)
    rotary = n - waiting - running
    states = (
        [RequestState.RUNNING] * running
        + [RequestState.WAITING] * waiting
        + [RequestState.ROTARY] * rotary
    )
    return [states[i] for i in rng.permutation(n).tolist()]


def fragmented_ids(total: int, run: int, rng: np.random.Generator) -> list[int]:
    """0..total-1 as runs of `run` consecutive ids in shuffled order."""
    starts = np.arange(0, total, max(run, 1))
    ids: list[int] = []
    for start in rng.permutation(starts).tolist():
        ids.extend(range(start, min(start + run, total)))
    return ids


class _Ids:
    """Hands out ids from a list in order."""

    def __init__(self, ids: list[int]) -> None:
        self._ids = ids
        self._next = 0

    def take(self, n: int) -> tuple[int, ...]:
        taken = tuple(self._ids[self._next : self._next + n])
        self._next += n
        return taken

    def rest(self) -> tuple[int, ...]:
        return tuple(self._ids[self._next :])


def generate(
    num_requests: int, seed: int, *, block_level: bool = False, mix: WorkloadMix | None = None
) -> SyntheticSnapshot:
    """A snapshot of num_requests tracked requests; equal for equal arguments."""
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    mix = mix or WorkloadMix()
    rng = np.random.default_rng([seed, num_requests])
    n = num_requests
    bs = mix.block_size_tokens
    states = _states(n, mix, rng)
    prompt = np.clip(
        rng.lognormal(math.log(mix.prompt_median_tokens), mix.prompt_sigma, n),
        1,
        mix.max_prompt_tokens,
    ).astype(np.int64)
    generated = rng.integers(1, mix.max_generated_tokens + 1, n)
    age = rng.uniform(0.0, 1.0, n)
    lead = rng.uniform(0.0, 1.0, n)
    synced_share = rng.uniform(0.0, 1.0, n)
    custom = rng.uniform(0.0, 1.0, n) < mix.custom_slo_fraction
    suffix = rng.integers(0, 1 << 32, n)
    tpot = rng.uniform(*mix.tpot_range_s, n)

    requests: list[TrackedRequest] = []
    now = mix.now_s
    for i in range(n):
        state = states[i]
        tokens = int(prompt[i] + generated[i])
        blocks = -(-tokens // bs)
        slo_ttft = mix.custom_slo.ttft_s if custom[i] else None
        slo_tbt = mix.custom_slo.tbt_s if custom[i] else None
        rid = f"cmpl-{i:05d}-{int(suffix[i]):08x}"
        prompt_blocks = -(-int(prompt[i]) // bs)
        if state == RequestState.WAITING:
            requests.append(
                TrackedRequest(
                    rid,
                    state,
                    arrival_s=now - mix.queue_window_s * float(age[i]),
                    prompt_blocks=prompt_blocks,
                    slo_ttft_s=slo_ttft,
                    slo_tbt_s=slo_tbt,
                )
            )
        elif state == RequestState.RUNNING:
            run_start = now - mix.horizon_s * float(age[i]) - 1e-3
            requests.append(
                TrackedRequest(
                    rid,
                    state,
                    arrival_s=run_start - 30.0 * float(lead[i]),
                    run_start_s=run_start,
                    prompt_blocks=prompt_blocks,
                    gpu_blocks=blocks,
                    num_tokens=tokens,
                    synced_blocks=int((tokens // bs) * float(synced_share[i])),
                    slo_ttft_s=slo_ttft,
                    slo_tbt_s=slo_tbt,
                    prefill_tokens=int(prompt[i]),
                    output_tokens=int(generated[i]),
                    first_token_s=now - float(tpot[i]) * int(generated[i]),
                )
            )
        else:
            last_token = now - mix.rotary_window_s * float(age[i])
            requests.append(
                TrackedRequest(
                    rid,
                    state,
                    arrival_s=last_token - 1.0 - mix.horizon_s * float(lead[i]),
                    last_token_s=last_token,
                    prompt_blocks=prompt_blocks,
                    cpu_blocks=blocks,
                    num_tokens=tokens,
                    slo_ttft_s=slo_ttft,
                    slo_tbt_s=slo_tbt,
                    prefill_tokens=int(prompt[i]),
                    output_tokens=int(generated[i]),
                    first_token_s=last_token - float(tpot[i]) * int(generated[i] - 1),
                )
            )

    free_gpu = int(sum(_need(r) for r in requests) * mix.free_fraction)
    running_blocks = sum(r.gpu_blocks for r in requests)
    free_cpu = max(2 * mix.transfer_budget_blocks, running_blocks)
    pools = None
    if block_level:
        requests, pools = _assign_block_ids(requests, free_gpu, free_cpu, mix, rng)
    return SyntheticSnapshot(
        seed=seed,
        mix=mix,
        requests=tuple(requests),
        free_gpu_blocks=free_gpu,
        free_cpu_blocks=free_cpu,
        pools=pools,
    )


def _assign_block_ids(
    requests: list[TrackedRequest],
    free_gpu: int,
    free_cpu: int,
    mix: WorkloadMix,
    rng: np.random.Generator,
) -> tuple[list[TrackedRequest], BlockPools]:
    gpu_used = sum(r.gpu_blocks for r in requests)
    cpu_used = sum(r.synced_blocks + r.cpu_blocks for r in requests)
    gpu = _Ids(fragmented_ids(gpu_used + free_gpu, mix.fragment_blocks, rng))
    cpu = _Ids(fragmented_ids(cpu_used + free_cpu, mix.fragment_blocks, rng))
    out = []
    for r in requests:
        if r.state == RequestState.RUNNING:
            # The first synced_blocks logical blocks have a CPU copy.
            gpu_ids, cpu_ids = gpu.take(r.gpu_blocks), cpu.take(r.synced_blocks)
            out.append(replace(r, gpu_block_ids=gpu_ids, cpu_block_ids=cpu_ids))
        elif r.state == RequestState.ROTARY:
            out.append(replace(r, cpu_block_ids=cpu.take(r.cpu_blocks)))
        else:
            out.append(r)
    return out, BlockPools(gpu.rest(), cpu.rest())
