"""Inputs and outputs of the rotation policy."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from planner.domain.requests import RequestState, Slo
from planner.profiles import HardwareProfile, ModelProfile

PAPER_TRANSFER_BUDGET_BLOCKS = 2400


@dataclass(frozen=True, slots=True)
class RotationParams:
    """Largest-VLT-First knobs; defaults are SuperInfer's evaluation values."""

    alpha: float = 3.0
    beta_tbt: float = 0.0
    beta_ttft: float = 0.5
    transfer_budget_blocks: int | None = None
    eager_budget_blocks: int | None = None


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


class CopyDirection(enum.IntEnum):
    D2H = 1
    H2D = 2


class MoveKind(enum.IntEnum):
    EAGER = 1
    SWAP_OUT = 2
    SWAP_IN = 3


class RequestDecision(NamedTuple):
    """A prioritized or preempted request with the VLT that picked it (a named
    tuple: plans at scale build thousands of these per decision)."""

    id: str
    state: RequestState
    vlt: float
    blocks: int


@dataclass(frozen=True, slots=True)
class BlockExtent:
    src_start: int
    dst_start: int
    num_blocks: int


@dataclass(frozen=True, slots=True)
class TransferBatch:
    direction: CopyDirection
    extents: tuple[BlockExtent, ...]
    num_blocks: int
    num_bytes: int


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
