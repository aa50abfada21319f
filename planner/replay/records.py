"""What a replay run produces: per-request lifecycles and a timeline."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestOutcome:
    """One request's life in the simulated engine. Times in simulated seconds.

    token_times_s holds the time of every output token, the first one
    included (so TTFT = token_times_s[0] - arrival_s, and each later gap is a
    TBT sample). finish_s is None for a request the run ended before
    finishing.
    """

    id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    slo_ttft_s: float
    slo_tbt_s: float
    token_times_s: list[float] = field(default_factory=list)
    finish_s: float | None = None
    preemptions: int = 0
    swap_outs: int = 0
    swap_ins: int = 0
    recomputed_tokens: int = 0
    # Prompt tokens found in the prefix cache when it first started.
    cached_tokens: int = 0


@dataclass(frozen=True, slots=True)
class UnitSample:
    """One unit's state at a timeline sample (a serverless MIG slice): its
    KV in use and the KV it can hold now (in the timeline's KV unit), the
    model weights resident in its memory, its requests running (prefill
    done) and queued on it (not yet, or their KV in host memory)."""

    name: str
    kv_used: int
    kv_capacity: int
    weight_bytes: float
    running: int
    waiting: int


# Not frozen: the single engine builds one per iteration, and a frozen
# dataclass's __init__ (object.__setattr__ per field) costs 2.5 times as much.
@dataclass(slots=True)
class TimelineSample:
    """Engine state at the end of one iteration (topologies that sample at
    fixed simulated times: at that time).

    waiting: requests waiting to be admitted (serverless: for a slice).
    Where the KV capacity moves during a run (serverless: HBM less the
    resident weights), gpu_kv_blocks_capacity is the capacity at the sample
    (0: the run's fixed ReplayTotals.gpu_kv_blocks_total); link_gbps is the
    shared host link's load since the previous sample (GB/s); units is each
    unit's own state.
    """

    time_s: float
    iteration_s: float
    stall_s: float
    gpu_kv_blocks_used: int
    cpu_kv_blocks_used: int
    running: int
    waiting: int
    rotary: int
    prefill_tokens: int
    decode_tokens: int
    # Sequences that took a prefill chunk (the single engine's; 0 elsewhere).
    prefill_sequences: int = 0
    gpu_kv_blocks_capacity: int = 0
    link_gbps: float = 0.0
    units: tuple[UnitSample, ...] = ()


@dataclass(frozen=True, slots=True)
class ReplayTotals:
    """Counters over a whole run."""

    iterations: int
    simulated_s: float
    wall_s: float
    bytes_d2h: int
    bytes_h2d: int
    stall_s: float
    preemptions: int
    swap_outs: int
    swap_ins: int
    peak_gpu_kv_blocks: int
    gpu_kv_blocks_total: int
    # Prefix caching: prompt tokens of the requests that started, and those
    # found cached at their first start (both 0 without a prefix cache).
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """One policy's run over one trace."""

    policy: str
    requests: list[RequestOutcome]
    timeline: list[TimelineSample]
    totals: ReplayTotals
    # The knobs the run used (profile names, SLOs, rate scale, seed, ...).
    config: dict[str, object] = field(default_factory=dict)
