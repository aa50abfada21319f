"""What an engine sees at one iteration: its tracked requests and block pools."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

DEFAULT_BLOCK_SIZE_TOKENS = 16
DEFAULT_TTFT_SLO_S = 5.0
DEFAULT_TBT_SLO_S = 0.1
NO_BLOCK = -1


class RequestState(enum.IntEnum):
    """Values equal the proto enum's."""

    WAITING = 1
    RUNNING = 2
    ROTARY = 3


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_s: float = DEFAULT_TTFT_SLO_S
    tbt_s: float = DEFAULT_TBT_SLO_S


@dataclass(frozen=True, slots=True)
class TrackedRequest:
    """One request as the engine tracks it; NaN marks an absent timestamp."""

    id: str
    state: RequestState
    arrival_s: float = math.nan
    run_start_s: float = math.nan
    last_token_s: float = math.nan
    prompt_blocks: int = 0
    gpu_blocks: int = 0
    cpu_blocks: int = 0
    num_tokens: int | None = None
    synced_blocks: int = 0
    slo_ttft_s: float | None = None
    slo_tbt_s: float | None = None
    gpu_block_ids: tuple[int, ...] = ()
    cpu_block_ids: tuple[int, ...] = ()

    def full_blocks(self, block_size_tokens: int) -> int:
        """GPU blocks that will receive no more writes."""
        if self.num_tokens is None:
            return max(self.gpu_blocks - 1, 0)
        return min(self.num_tokens // block_size_tokens, self.gpu_blocks)


@dataclass(frozen=True, slots=True)
class BlockPools:
    free_gpu_block_ids: tuple[int, ...] = ()
    free_cpu_block_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class RequestTable:
    """The tracked requests as columns, so policies run vectorized.

    Row i describes ids[i]. Absent timestamps are NaN; absent per-request SLOs
    are NaN (the snapshot's SLO applies).
    """

    ids: list[str]
    state: npt.NDArray[np.int8]
    arrival_s: npt.NDArray[np.float64]
    run_start_s: npt.NDArray[np.float64]
    last_token_s: npt.NDArray[np.float64]
    prompt_blocks: npt.NDArray[np.int64]
    gpu_blocks: npt.NDArray[np.int64]
    cpu_blocks: npt.NDArray[np.int64]
    full_blocks: npt.NDArray[np.int64]
    synced_blocks: npt.NDArray[np.int64]
    slo_ttft_s: npt.NDArray[np.float64]
    slo_tbt_s: npt.NDArray[np.float64]
    gpu_block_ids: list[tuple[int, ...]] = field(default_factory=list)
    cpu_block_ids: list[tuple[int, ...]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)

    @staticmethod
    def from_requests(
        requests: Sequence[TrackedRequest],
        block_size_tokens: int = DEFAULT_BLOCK_SIZE_TOKENS,
        block_level: bool = False,
    ) -> RequestTable:
        """Columns from rows. With block_level, block id lists are kept and
        GPU/CPU/synced counts are taken from them."""

        def col(values: list[float]) -> npt.NDArray[np.float64]:
            return np.array(values, dtype=np.float64)

        def icol(values: list[int]) -> npt.NDArray[np.int64]:
            return np.array(values, dtype=np.int64)

        gpu = [len(r.gpu_block_ids) if block_level else r.gpu_blocks for r in requests]
        cpu = [
            (sum(1 for b in r.cpu_block_ids if b != NO_BLOCK) if block_level else r.cpu_blocks)
            for r in requests
        ]
        full = [
            r.full_blocks(block_size_tokens)
            if not block_level
            else _full_blocks(r.num_tokens, len(r.gpu_block_ids), block_size_tokens)
            for r in requests
        ]
        synced = [
            _synced_count(r.cpu_block_ids, len(r.gpu_block_ids))
            if block_level
            else min(r.synced_blocks, r.gpu_blocks)
            for r in requests
        ]
        nan = math.nan
        return RequestTable(
            ids=[r.id for r in requests],
            state=np.array([int(r.state) for r in requests], dtype=np.int8),
            arrival_s=col([r.arrival_s for r in requests]),
            run_start_s=col([r.run_start_s for r in requests]),
            last_token_s=col([r.last_token_s for r in requests]),
            prompt_blocks=icol([r.prompt_blocks for r in requests]),
            gpu_blocks=icol(gpu),
            cpu_blocks=icol(cpu),
            full_blocks=icol(full),
            synced_blocks=icol(synced),
            slo_ttft_s=col([nan if r.slo_ttft_s is None else r.slo_ttft_s for r in requests]),
            slo_tbt_s=col([nan if r.slo_tbt_s is None else r.slo_tbt_s for r in requests]),
            gpu_block_ids=[r.gpu_block_ids for r in requests] if block_level else [],
            cpu_block_ids=[r.cpu_block_ids for r in requests] if block_level else [],
        )


def _full_blocks(num_tokens: int | None, gpu_blocks: int, block_size_tokens: int) -> int:
    if num_tokens is None:
        return max(gpu_blocks - 1, 0)
    return min(num_tokens // block_size_tokens, gpu_blocks)


def _synced_count(cpu_block_ids: tuple[int, ...], gpu_blocks: int) -> int:
    """GPU blocks that already have a CPU copy."""
    return sum(1 for b in cpu_block_ids[:gpu_blocks] if b != NO_BLOCK)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One engine iteration as the planner sees it.

    free_cpu_blocks None: the CPU pool is not a constraint. pools set: block
    level planning (every block id is known).
    """

    now_s: float
    free_gpu_blocks: int
    requests: RequestTable
    block_size_tokens: int = DEFAULT_BLOCK_SIZE_TOKENS
    free_cpu_blocks: int | None = None
    last_iteration_s: float | None = None
    pools: BlockPools | None = None

    @property
    def block_level(self) -> bool:
        return self.pools is not None
