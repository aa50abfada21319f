"""Inputs and outputs of the rotation policy."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from planner.domain.requests import RequestState, Slo
from planner.kernels.transfer_batch import TransferBatch
from planner.profiles import HardwareProfile, ModelProfile

PAPER_TRANSFER_BUDGET_BLOCKS = 2400


class RotationVariant(enum.IntEnum):
    """Which Largest-VLT-First runs (DESIGN.md §3.1).

    LVF: every block moved is charged to the link budget, only lagging
    requests may displace running ones, and only running requests with TPOT
    slack to spare are displaced. LVF_PAPER: the paper's Algorithm 1 as
    printed (B_xfer bounds only the blocks preemption must free)."""

    LVF = 1
    LVF_PAPER = 2


@dataclass(frozen=True, slots=True)
class RotationParams:
    """Largest-VLT-First knobs; alpha, the betas and the paper's B_xfer are
    SuperInfer's evaluation values.

    The slack knobs bound LVF's rotation, in units of each request's TBT SLO.
    A request's TPOT slack is how long it may go without a token and still
    have a mean time per output token within its TBT SLO: first token time
    + slo_tbt x tokens generated - now. A running request may be preempted
    only with at least preempt_slack_tbts of slack; a rotary request may
    displace a running one only once its slack has fallen to
    resume_slack_tbts. The gap between the two is the least a rotation buys
    its victim, so a request cannot be rotated in and out at every iteration.
    """

    alpha: float = 3.0
    beta_tbt: float = 0.0
    beta_ttft: float = 0.5
    transfer_budget_blocks: int | None = None
    eager_budget_blocks: int | None = None
    variant: RotationVariant = RotationVariant.LVF
    preempt_slack_tbts: float = 160.0
    resume_slack_tbts: float = 10.0
    lost_slack_tbts: float | None = 10.0


@dataclass(frozen=True, slots=True)
class RotationInputs:
    """Everything one rotation decision depends on besides the snapshot."""

    params: RotationParams = field(default_factory=RotationParams)
    slo: Slo = field(default_factory=Slo)
    model: ModelProfile | None = None
    hardware: HardwareProfile | None = None


class BudgetSource(enum.IntEnum):
    GIVEN = 1
    DERIVED = 2
    DEFAULT = 3


class MoveKind(enum.IntEnum):
    EAGER = 1
    SWAP_OUT = 2
    SWAP_IN = 3


class Held(NamedTuple):
    """Waiting and rotary requests the bounded LVF left out, by reason."""

    # Waiting: the engine's token budget or running-request cap has no room.
    engine_full: int = 0
    # Rotary: their blocks do not fit in this iteration's H2D budget.
    link_full: int = 0
    # Did not fit in the free blocks and may not displace a running request:
    # within their tolerance (waiting), or with slack to spare (rotary).
    not_lagging: int = 0
    # Lagging, but no running request with enough slack (or whose DIRTY
    # blocks the link and the CPU pool could take) makes room for them.
    no_victim: int = 0


class RequestDecision(NamedTuple):
    """A prioritized or preempted request with the VLT that picked it (a named
    tuple: plans at scale build thousands of these per decision)."""

    id: str
    state: RequestState
    vlt: float
    blocks: int


@dataclass(frozen=True, slots=True)
class RequestBlockMoves:
    id: str
    kind: MoveKind
    logical_index: tuple[int, ...]
    src_block_ids: tuple[int, ...]
    dst_block_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RotationExplanation:
    transfer_budget_blocks: int
    budget_source: BudgetSource
    free_gpu_blocks: int
    blocks_needed: int
    blocks_left: int = 0
    swap_blocks_needed: int = 0
    blocks_released_now: int = 0
    blocks_freed_after_d2h: int = 0
    swap_in_blocks: int = 0
    swap_out_blocks: int = 0
    eager_blocks: int = 0
    unmet_swap_blocks: int = 0
    deferred_swap_in_ids: tuple[str, ...] = ()
    cpu_full_skipped_ids: tuple[str, ...] = ()
    trimmed_ids: tuple[str, ...] = ()
    summary: str = ""
    variant: RotationVariant = RotationVariant.LVF
    # LVF's link budget besides transfer_budget_blocks (the H2D one), and
    # why it left waiting and rotary requests out.
    d2h_budget_blocks: int = 0
    link_half_duplex: bool = False
    held: Held = field(default_factory=Held)


@dataclass(frozen=True, slots=True)
class RotationPlan:
    fcfs_fallback: bool
    prioritized: tuple[RequestDecision, ...]
    preempted: tuple[RequestDecision, ...]
    explanation: RotationExplanation
    batches: tuple[TransferBatch, ...] = ()
    moves: tuple[RequestBlockMoves, ...] = ()
    released_gpu_block_ids: tuple[int, ...] = ()
    freed_after_d2h_gpu_block_ids: tuple[int, ...] = field(default=())
