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
        builder = RequestTableBuilder(block_size_tokens, block_level)
        for r in requests:
            builder.add(
                r.id,
                r.state,
                arrival_s=r.arrival_s,
                run_start_s=r.run_start_s,
                last_token_s=r.last_token_s,
                prompt_blocks=r.prompt_blocks,
                gpu_blocks=r.gpu_blocks,
                cpu_blocks=r.cpu_blocks,
                num_tokens=r.num_tokens,
                synced_blocks=r.synced_blocks,
                slo_ttft_s=r.slo_ttft_s,
                slo_tbt_s=r.slo_tbt_s,
                gpu_block_ids=r.gpu_block_ids,
                cpu_block_ids=r.cpu_block_ids,
            )
        return builder.build()


class RequestTableBuilder:
    """Collects rows and builds a RequestTable in one pass (the service's hot
    path: no per-row objects)."""

    def __init__(self, block_size_tokens: int, block_level: bool) -> None:
        self.block_size_tokens = block_size_tokens
        self.block_level = block_level
        self.ids: list[str] = []
        self._state: list[int] = []
        self._times: list[tuple[float, float, float]] = []
        self._counts: list[tuple[int, int, int, int, int]] = []
        self._slo: list[tuple[float, float]] = []
        self._gpu_ids: list[tuple[int, ...]] = []
        self._cpu_ids: list[tuple[int, ...]] = []

    def add(
        self,
        id: str,
        state: int,
        *,
        arrival_s: float,
        run_start_s: float,
        last_token_s: float,
        prompt_blocks: int,
        gpu_blocks: int,
        cpu_blocks: int,
        num_tokens: int | None,
        synced_blocks: int,
        slo_ttft_s: float | None,
        slo_tbt_s: float | None,
        gpu_block_ids: tuple[int, ...] = (),
        cpu_block_ids: tuple[int, ...] = (),
    ) -> None:
        """Absent times are NaN; with block_level the counts come from the id
        lists."""
        if self.block_level:
            gpu_blocks = len(gpu_block_ids)
            if state == RequestState.ROTARY:
                cpu_blocks = len(cpu_block_ids)
            synced_blocks = sum(1 for b in cpu_block_ids[:gpu_blocks] if b != NO_BLOCK)
            self._gpu_ids.append(gpu_block_ids)
            self._cpu_ids.append(cpu_block_ids)
        self.ids.append(id)
        self._state.append(int(state))
        self._times.append((arrival_s, run_start_s, last_token_s))
        self._counts.append(
            (
                prompt_blocks,
                gpu_blocks,
                cpu_blocks,
                -1 if num_tokens is None else num_tokens,
                min(synced_blocks, gpu_blocks),
            )
        )
        self._slo.append(
            (
                math.nan if slo_ttft_s is None else slo_ttft_s,
                math.nan if slo_tbt_s is None else slo_tbt_s,
            )
        )

    def build(self) -> RequestTable:
        n = len(self.ids)
        times = np.array(self._times, dtype=np.float64).reshape(n, 3)
        counts = np.array(self._counts, dtype=np.int64).reshape(n, 5)
        slo = np.array(self._slo, dtype=np.float64).reshape(n, 2)
        gpu = counts[:, 1].copy()
        num_tokens = counts[:, 3]
        full = np.where(
            num_tokens < 0,
            np.maximum(gpu - 1, 0),
            np.minimum(num_tokens // self.block_size_tokens, gpu),
        )
        return RequestTable(
            ids=self.ids,
            state=np.array(self._state, dtype=np.int8),
            arrival_s=times[:, 0].copy(),
            run_start_s=times[:, 1].copy(),
            last_token_s=times[:, 2].copy(),
            prompt_blocks=counts[:, 0].copy(),
            gpu_blocks=gpu,
            cpu_blocks=counts[:, 2].copy(),
            full_blocks=full,
            synced_blocks=counts[:, 4].copy(),
            slo_ttft_s=slo[:, 0].copy(),
            slo_tbt_s=slo[:, 1].copy(),
            gpu_block_ids=self._gpu_ids,
            cpu_block_ids=self._cpu_ids,
        )


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
