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
    prefill_tokens: int | None = None
    output_tokens: int | None = None
    first_token_s: float = math.nan


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
    # Tokens whose KV is written, the tokens the request's prefill covers
    # (its prompt, plus generated tokens it recomputes) and the tokens it has
    # generated: -1 where unknown. When its first token came: NaN if unknown.
    num_tokens: npt.NDArray[np.int64]
    prefill_tokens: npt.NDArray[np.int64]
    output_tokens: npt.NDArray[np.int64]
    first_token_s: npt.NDArray[np.float64]
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
                prefill_tokens=r.prefill_tokens,
                output_tokens=r.output_tokens,
                first_token_s=r.first_token_s,
            )
        return builder.build()


class RequestTableBuilder:
    """Collects rows and builds a RequestTable."""

    def __init__(self, block_size_tokens: int, block_level: bool) -> None:
        self.block_size_tokens = block_size_tokens
        self.block_level = block_level
        self.ids: list[str] = []
        self._rows: list[
            tuple[int, float, float, float, int, int, int, int, int, float, float, int, int, float]
        ] = []
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
        prefill_tokens: int | None = None,
        output_tokens: int | None = None,
        first_token_s: float = math.nan,
    ) -> None:
        """Absent times are NaN; with block_level the counts come from the id
        lists."""
        self.ids.append(id)
        self._rows.append(
            (
                int(state),
                arrival_s,
                run_start_s,
                last_token_s,
                prompt_blocks,
                gpu_blocks,
                cpu_blocks,
                -1 if num_tokens is None else num_tokens,
                synced_blocks,
                math.nan if slo_ttft_s is None else slo_ttft_s,
                math.nan if slo_tbt_s is None else slo_tbt_s,
                -1 if prefill_tokens is None else prefill_tokens,
                -1 if output_tokens is None else output_tokens,
                first_token_s,
            )
        )
        self._gpu_ids.append(gpu_block_ids)
        self._cpu_ids.append(cpu_block_ids)

    def build(self) -> RequestTable:
        n = len(self.ids)
        columns = list(zip(*self._rows, strict=True)) if n else [()] * 14
        return table_from_columns(
            self.ids,
            state=np.array(columns[0], dtype=np.int8),
            arrival_s=np.array(columns[1], dtype=np.float64),
            run_start_s=np.array(columns[2], dtype=np.float64),
            last_token_s=np.array(columns[3], dtype=np.float64),
            prompt_blocks=np.array(columns[4], dtype=np.int64),
            gpu_blocks=np.array(columns[5], dtype=np.int64),
            cpu_blocks=np.array(columns[6], dtype=np.int64),
            num_tokens=np.array(columns[7], dtype=np.int64),
            synced_blocks=np.array(columns[8], dtype=np.int64),
            slo_ttft_s=np.array(columns[9], dtype=np.float64),
            slo_tbt_s=np.array(columns[10], dtype=np.float64),
            prefill_tokens=np.array(columns[11], dtype=np.int64),
            output_tokens=np.array(columns[12], dtype=np.int64),
            first_token_s=np.array(columns[13], dtype=np.float64),
            block_size_tokens=self.block_size_tokens,
            gpu_block_ids=self._gpu_ids if self.block_level else None,
            cpu_block_ids=self._cpu_ids if self.block_level else None,
        )


def table_from_columns(
    ids: list[str],
    *,
    state: npt.NDArray[np.int8],
    arrival_s: npt.NDArray[np.float64],
    run_start_s: npt.NDArray[np.float64],
    last_token_s: npt.NDArray[np.float64],
    prompt_blocks: npt.NDArray[np.int64],
    gpu_blocks: npt.NDArray[np.int64],
    cpu_blocks: npt.NDArray[np.int64],
    num_tokens: npt.NDArray[np.int64],
    synced_blocks: npt.NDArray[np.int64],
    slo_ttft_s: npt.NDArray[np.float64],
    slo_tbt_s: npt.NDArray[np.float64],
    block_size_tokens: int,
    gpu_block_ids: list[tuple[int, ...]] | None = None,
    cpu_block_ids: list[tuple[int, ...]] | None = None,
    prefill_tokens: npt.NDArray[np.int64] | None = None,
    output_tokens: npt.NDArray[np.int64] | None = None,
    first_token_s: npt.NDArray[np.float64] | None = None,
) -> RequestTable:
    """A RequestTable from columns. num_tokens < 0 means unknown (every GPU
    block but the last counts as full); so do prefill_tokens and
    output_tokens < 0 or absent, and first_token_s NaN or absent. With block
    id lists (block-level), GPU, ROTARY CPU and SYNCED counts are taken from
    the lists."""
    n = len(ids)
    if gpu_block_ids is not None and cpu_block_ids is not None:
        gpu_blocks = np.fromiter(map(len, gpu_block_ids), dtype=np.int64, count=len(ids))
        rotary = state == np.int8(RequestState.ROTARY)
        cpu_counts = np.fromiter(map(len, cpu_block_ids), dtype=np.int64, count=len(ids))
        cpu_blocks = np.where(rotary, cpu_counts, cpu_blocks)
        synced_blocks = np.fromiter(
            (
                sum(1 for b in cpu[:g] if b != NO_BLOCK)
                for cpu, g in zip(cpu_block_ids, gpu_blocks.tolist(), strict=True)
            ),
            dtype=np.int64,
            count=len(ids),
        )
    full = np.where(
        num_tokens < 0,
        np.maximum(gpu_blocks - 1, 0),
        np.minimum(num_tokens // block_size_tokens, gpu_blocks),
    )
    return RequestTable(
        ids=ids,
        state=state,
        arrival_s=arrival_s,
        run_start_s=run_start_s,
        last_token_s=last_token_s,
        prompt_blocks=prompt_blocks,
        gpu_blocks=gpu_blocks,
        cpu_blocks=cpu_blocks,
        full_blocks=full,
        synced_blocks=np.minimum(synced_blocks, gpu_blocks),
        slo_ttft_s=slo_ttft_s,
        slo_tbt_s=slo_tbt_s,
        num_tokens=num_tokens,
        prefill_tokens=_unknown_counts(n) if prefill_tokens is None else prefill_tokens,
        output_tokens=_unknown_counts(n) if output_tokens is None else output_tokens,
        first_token_s=np.full(n, math.nan) if first_token_s is None else first_token_s,
        gpu_block_ids=gpu_block_ids if gpu_block_ids is not None else [],
        cpu_block_ids=cpu_block_ids if cpu_block_ids is not None else [],
    )


def _unknown_counts(n: int) -> npt.NDArray[np.int64]:
    return np.full(n, -1, dtype=np.int64)


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
    # The engine's per-iteration token budget and running-request cap (None:
    # not a constraint the planner knows of).
    max_batched_tokens: int | None = None
    max_running_requests: int | None = None

    @property
    def block_level(self) -> bool:
        return self.pools is not None
