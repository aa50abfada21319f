"""Every request inside the simulated engine, as numpy columns indexed by the
request's row in the trace (row i is trace[i]), so the engine and the
schedulers work on many requests at once.

KV accounting: a prefill over all known tokens (prompt plus those generated
so far) emits the next token; each decode step feeds the newest token (its KV
is written) and emits one.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from planner.domain.requests import Slo
from planner.trace.records import TraceRequest

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
PhaseArray = npt.NDArray[np.int8]


class Phase(enum.IntEnum):
    NOT_ARRIVED = 0
    QUEUED = 1  # waiting for admission (new, or preempted by recompute)
    RUNNING = 2  # KV on the GPU: prefilling or decoding
    ROTARY = 3  # preempted by swap: KV in CPU memory
    IN_TRANSIT = 4  # being swapped in this iteration; runs from the next one
    FINISHED = 5
    REJECTED = 6  # needs more KV than the whole GPU pool: never queued


@dataclass(slots=True)
class RequestColumns:
    """Per-request state, one array per field. Absent times are NaN."""

    ids: list[str]
    # ids as an object array, for fancy indexing; row_of maps an id to its row
    # (None when two requests share an id).
    id_array: npt.NDArray[np.object_]
    row_of: dict[str, int] | None
    arrival_s: FloatArray
    prompt_tokens: IntArray
    output_tokens: IntArray
    slo_ttft_s: FloatArray
    slo_tbt_s: FloatArray
    phase: PhaseArray
    generated: IntArray
    kv_tokens: IntArray
    # Tokens the current prefill covers: the prompt, plus the tokens generated
    # before a preemption by recompute.
    prefill_target: IntArray
    gpu_blocks: IntArray
    cpu_blocks: IntArray
    # GPU blocks with an identical CPU copy (DuplexKV's SYNCED blocks).
    synced_blocks: IntArray
    # GPU blocks a queued request needs to start, or a rotary one to resume
    # (blocks_needed: kept from the start, and set again at each preemption).
    start_blocks: IntArray
    run_start_s: FloatArray  # since when it runs without interruption
    admitted_at_s: FloatArray  # its latest admission from the queue
    last_prefill_s: FloatArray  # its latest prefill chunk (its arrival before)
    last_token_s: FloatArray
    first_token_s: FloatArray
    finish_s: FloatArray
    preemptions: IntArray
    swap_outs: IntArray
    swap_ins: IntArray
    recomputed_tokens: IntArray
    # The most tokens one prefill chunk of the request may take, below the
    # engine's own cap (0: no cap of its own; a topology that sizes chunks
    # per request sets it).
    chunk_tokens: IntArray

    def __len__(self) -> int:
        return len(self.ids)

    @staticmethod
    def from_trace(trace: Sequence[TraceRequest], slo: Slo) -> RequestColumns:
        n = len(trace)
        ids = [t.id if t.id is not None else f"r{i}" for i, t in enumerate(trace)]
        id_array = np.empty(n, dtype=object)
        id_array[:] = ids
        row_of = {id: row for row, id in enumerate(ids)}
        prompt = np.fromiter((t.prompt_tokens for t in trace), np.int64, n)

        def floats(values: Sequence[float]) -> FloatArray:
            return np.array(values, dtype=np.float64).reshape(n)

        arrival = floats([t.arrival_s for t in trace])

        def zeros() -> IntArray:
            return np.zeros(n, dtype=np.int64)

        def nans() -> FloatArray:
            return np.full(n, np.nan)

        return RequestColumns(
            ids=ids,
            id_array=id_array,
            row_of=row_of if len(row_of) == n else None,
            arrival_s=arrival,
            prompt_tokens=prompt,
            output_tokens=np.fromiter((t.output_tokens for t in trace), np.int64, n),
            slo_ttft_s=floats(
                [slo.ttft_s if t.slo_ttft_s is None else t.slo_ttft_s for t in trace]
            ),
            slo_tbt_s=floats([slo.tbt_s if t.slo_tbt_s is None else t.slo_tbt_s for t in trace]),
            phase=np.full(n, Phase.NOT_ARRIVED, dtype=np.int8),
            generated=zeros(),
            kv_tokens=zeros(),
            prefill_target=prompt.copy(),
            gpu_blocks=zeros(),
            cpu_blocks=zeros(),
            synced_blocks=zeros(),
            start_blocks=zeros(),
            run_start_s=nans(),
            admitted_at_s=nans(),
            last_prefill_s=arrival.copy(),
            last_token_s=nans(),
            first_token_s=nans(),
            finish_s=nans(),
            preemptions=zeros(),
            swap_outs=zeros(),
            swap_ins=zeros(),
            recomputed_tokens=zeros(),
            chunk_tokens=zeros(),
        )


def blocks_needed(requests: RequestColumns, rows: IntArray, block_size: int) -> IntArray:
    """GPU blocks queued requests need to start, or rotary ones to resume:
    the whole prefill while there is one to do; else the KV plus the token
    the next decode writes (resumed into just the blocks it had, a request
    whose KV ends on a block boundary would be preempted again at once)."""
    kv = requests.kv_tokens[rows]
    target = requests.prefill_target[rows]
    need: IntArray = np.where(
        kv < target, np.maximum(-(-target // block_size), 1), -(-(kv + 1) // block_size)
    )
    return need


def blocks_needed_one(kv_tokens: int, prefill_target: int, block_size: int) -> int:
    """blocks_needed of one request."""
    if kv_tokens < prefill_target:
        return max(-(-prefill_target // block_size), 1)
    return -(-(kv_tokens + 1) // block_size)


def start_candidates(requests: RequestColumns, rows: IntArray) -> Iterator[tuple[int, int, int]]:
    """(row, its start_blocks, its phase) of each of rows, read a growing
    chunk at a time: a plan may list the whole queue, and mostly only its
    head is looked at."""
    if not len(rows):
        return
    head = int(rows[0])
    yield head, int(requests.start_blocks[head]), int(requests.phase[head])
    begin, size = 1, 8
    while begin < len(rows):
        chunk = rows[begin : begin + size]
        yield from zip(
            chunk.tolist(),
            requests.start_blocks[chunk].tolist(),
            requests.phase[chunk].tolist(),
            strict=True,
        )
        begin += size
        size *= 8
