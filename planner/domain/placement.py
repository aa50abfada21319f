"""Inputs and outputs of producer/consumer memory sharing (AQUA, DESIGN.md
§3.4): deployment roles, model-to-server placement, per-server matching, and
the lease ledger's records.

Memory is in bytes. A model's memory requirement R (`r_bytes`) is > 0 for a
producer (spare GPU memory it can lend) and < 0 for a consumer (memory it
needs beyond its GPUs); 0 is neither."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

GB = 10**9
DEFAULT_PRODUCER_THRESHOLD_BYTES = 10 * GB


class Role(enum.StrEnum):
    PRODUCER = "producer"
    CONSUMER = "consumer"
    # Not enough spare memory to lend and no swap demand (the paper treats it
    # as a producer with 0 bytes to offer; it counts for neither side).
    NEUTRAL = "neutral"


# ---- roles ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchPoint:
    """Non-LLM profile: throughput and GPU memory in use at one batch size."""

    batch_size: int
    throughput: float
    used_bytes: int


@dataclass(frozen=True, slots=True)
class RatePoint:
    """LLM profile: latency and GPU memory at one steady request rate."""

    rate_rps: float
    ttft_s: float
    tbt_s: float
    used_bytes: int


@dataclass(frozen=True, slots=True)
class DeploymentProfile:
    id: str
    gpu_memory_bytes: int
    # Non-LLM models: batch_curve; LLMs: rate_curve (one of the two).
    batch_curve: tuple[BatchPoint, ...] = ()
    rate_curve: tuple[RatePoint, ...] = ()
    slo_ttft_s: float = 1.0
    slo_tbt_s: float = 0.1
    # Swap space it needs (profiled under bursts); > 0 makes a non-producer a consumer.
    swap_demand_bytes: int = 0
    # GPUs of the deployment (tensor-parallel shards).
    shards: int = 1

    @property
    def is_llm(self) -> bool:
        return bool(self.rate_curve)


@dataclass(frozen=True, slots=True)
class RoleConfig:
    threshold_bytes: int = DEFAULT_PRODUCER_THRESHOLD_BYTES
    # Non-LLM: throughput saturates at the first batch size within this
    # fraction of the curve's best throughput.
    saturation_tolerance: float = 0.05
    # LLM: binary search over [rate_low_rps, rate_high_rps] (0, 0: the
    # curve's range) to within rate_step_rps, then a linear search in steps of
    # rate_step_rps up and down.
    rate_low_rps: float = 0.0
    rate_high_rps: float = 0.0
    rate_step_rps: float = 0.5


@dataclass(frozen=True, slots=True)
class RoleDecision:
    id: str
    role: Role
    # Signed memory requirement for the placer.
    r_bytes: int
    free_bytes: int
    # Where the free memory was read: the saturating batch size (non-LLM) or
    # the highest SLA-sustainable rate (LLM; 0 when none is sustainable).
    batch_size: int = 0
    sustainable_rate_rps: float = 0.0
    # LLM: rates the search evaluated, in order.
    probes_rps: tuple[float, ...] = ()
    reason: str = ""


# ---- placement --------------------------------------------------------------


class PlacerObjective(enum.StrEnum):
    # Ours: max_s |mem_s| + G_mem * max_s |eq_s| (imbalance either way counts).
    BALANCED_ABS = "balanced-abs"
    # The paper's Eq. 6 as printed: max_s mem_s + G_mem * max_s eq_s.
    PAPER = "paper"


@dataclass(frozen=True, slots=True)
class PlacedModel:
    id: str
    r_bytes: int
    # Tensor-parallel shards, one GPU each, all on one server.
    shards: int = 1
    # Index of the server it runs on now (None: not placed yet).
    current_server: int | None = None


@dataclass(frozen=True, slots=True)
class PlacementInputs:
    models: tuple[PlacedModel, ...]
    num_servers: int
    gpus_per_server: int
    gpu_memory_bytes: int
    objective: PlacerObjective = PlacerObjective.BALANCED_ABS
    # Objective cost of moving one already-placed model (bytes, in the
    # objective's memory units); None: 1% of gpu_memory_bytes.
    move_cost_bytes: int | None = None
    # At most this many already-placed models move (None: no limit).
    max_moves: int | None = None


@dataclass(frozen=True, slots=True)
class Placement:
    # Server index per model, in the order of PlacementInputs.models.
    servers: tuple[int, ...]
    objective_bytes: float
    mem_bytes: tuple[int, ...]
    eq: tuple[int, ...]
    moves: int
    status: str
    backend: str
    best_bound_bytes: float | None = None
    gap: float | None = None
    wall_time_s: float = 0.0
    fallback: bool = False
    note: str = ""


# ---- matching ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MatchGpu:
    """One GPU of a server: a producer shard (spare_bytes > 0) or a consumer
    shard (demand_bytes > 0)."""

    id: str
    spare_bytes: int = 0
    demand_bytes: int = 0
    # Its peer (NVLink) bandwidth, and what a consumer's paging needs of it.
    link_gbps: float = 0.0
    paging_gbps: float = 0.0


@dataclass(frozen=True, slots=True)
class MatchPair:
    producer_id: str
    consumer_id: str
    # min(spare, demand); the rest of the demand goes to CPU DRAM.
    covered_bytes: int
    dram_bytes: int
    # min(producer link, consumer link) - consumer paging need.
    headroom_gbps: float


@dataclass(frozen=True, slots=True)
class ServerMatching:
    pairs: tuple[MatchPair, ...]
    # Consumers without a producer: all their demand pages to CPU DRAM.
    dram_consumers: tuple[str, ...]
    idle_producers: tuple[str, ...]


# ---- lease ledger -----------------------------------------------------------


class LeaseState(enum.StrEnum):
    ACTIVE = "active"
    # Its producer reclaimed it: the consumer moves its tensors to DRAM by the
    # deadline, then frees it.
    REVOKING = "revoking"


@dataclass(slots=True)
class ProducerAccount:
    producer_id: str
    server_id: str = ""
    # Bytes the producer has lent to the ledger and not yet got back
    # (leased or free); leased_bytes <= offered_bytes always.
    offered_bytes: int = 0
    leased_bytes: int = 0
    # Lifetime totals: offered_total - returned_total == offered_bytes.
    offered_total_bytes: int = 0
    returned_total_bytes: int = 0

    @property
    def free_bytes(self) -> int:
        return self.offered_bytes - self.leased_bytes


@dataclass(slots=True)
class Lease:
    lease_id: str
    producer_id: str
    consumer_id: str
    bytes: int
    state: LeaseState = LeaseState.ACTIVE
    created_s: float = 0.0
    reclaim_id: str = ""
    deadline_s: float = 0.0


@dataclass(slots=True)
class Reclaim:
    reclaim_id: str
    producer_id: str
    requested_bytes: int
    requested_s: float
    deadline_s: float
    # Given back to the producer so far; requested - returned is outstanding.
    returned_bytes: int = 0
    lease_ids: list[str] = field(default_factory=list)

    @property
    def outstanding_bytes(self) -> int:
        return self.requested_bytes - self.returned_bytes

    @property
    def complete(self) -> bool:
        return self.outstanding_bytes == 0


# ---- CFS batch partitioning ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class CfsRequest:
    id: str
    prompt_tokens: int
    # Prompt tokens whose KV is computed; == prompt_tokens once decoding.
    prefilled_tokens: int = 0
    generated_tokens: int = 0
    # KV on the GPU now (else paged out to the peer GPU or DRAM).
    resident: bool = False
    arrival_s: float = 0.0

    @property
    def decoding(self) -> bool:
        return self.prefilled_tokens >= self.prompt_tokens


@dataclass(frozen=True, slots=True)
class CfsInputs:
    requests: tuple[CfsRequest, ...]
    # b: tokens per iteration.
    token_budget: int
    # GPU KV capacity and the block size.
    gpu_blocks: int
    block_size: int = 16
    # Reschedule every k iterations (or when a request completes).
    reschedule_every: int = 8
    iteration: int = 0


@dataclass(frozen=True, slots=True)
class CfsPlan:
    # d decode slots (one token each), fewest generated tokens first.
    decode_ids: tuple[str, ...]
    # p prefill slots: (id, tokens this iteration), least prefill progress first.
    prefill_chunks: tuple[tuple[str, int], ...]
    # Residency changes: KV to page out (not in the batch) and in (in it).
    page_out_ids: tuple[str, ...]
    page_in_ids: tuple[str, ...]
    page_out_blocks: int
    page_in_blocks: int
    # d's upper bound: the most prompts whose KV fits in GPU memory.
    decode_slots: int
    prefill_tokens: int
    blocks_used: int
    # Keep this partition until this iteration (or a completion).
    next_reschedule_iteration: int
