"""One iteration's batch under a token budget: every running request that has
finished its prefill decodes one token (in admission order, while the budget
lasts), then prefilling ones take chunks of what is left in admission order (each
at most the request's own chunk_tokens, where set). A decode that crosses a
block boundary takes a new block; when none is free the most recently
admitted request is preempted for it (EngineState.grow).

Two ways to the same batch: on whole columns for many running requests, and
request by request on Python ints below SMALL_BATCH of them, where a few
dozen numpy calls on tiny arrays cost more than the loop (a cluster's
instances run a handful of requests each)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from planner.replay.engine_state import EngineState
from planner.replay.state import IntArray

_NONE: IntArray = np.zeros(0, dtype=np.int64)
# Running requests from which a batch is formed on whole columns (measured:
# docs/benchmarks.md, the small-batch path).
SMALL_BATCH = 16


class Batch(NamedTuple):
    prefill_tokens: int
    decode_tokens: int
    # KV tokens the batch attends to: each request's KV after this iteration.
    context_tokens: int
    # Requests that emit a token at the end of the iteration.
    emitting: IntArray
    # Blocks copied out by preemptions while forming the batch.
    preempted_d2h_blocks: int
    # The prefilling requests' rows and their chunks, in order (the first
    # decode_tokens of emitting are the decoding requests).
    prefill_rows: IntArray
    prefill_chunks: IntArray

    def prefill_attention_pairs(self, kv_tokens: IntArray) -> int:
        """Causal attention pairs of the prefill chunks: each chunk's tokens
        attend to the KV before it and to the chunk's tokens up to their own.
        kv_tokens: the requests' KV after the batch."""
        chunk = self.prefill_chunks
        before = kv_tokens[self.prefill_rows] - chunk
        return int((chunk * before + chunk * (chunk + 1) // 2).sum())


def form_batch(
    state: EngineState, budget: int, now_s: float, swaps: bool, max_chunk: int | None = None
) -> Batch:
    """Decodes first, then prefill chunks (of at most max_chunk tokens each,
    when given); swaps: whether a preemption for a block swaps (else it
    recomputes).

    The decodes go all at once up to the first that finds no free block; that
    one preempts for it, then the rest go on the same way. Preemptions take
    from the tail of running, so never a request whose turn came already.
    """
    if len(state.running.rows) < SMALL_BATCH:
        return _form_small_batch(state, budget, now_s, swaps, max_chunk)
    r = state.requests
    decoders: list[IntArray] = []
    pending: list[IntArray] = []
    pending_left: list[IntArray] = []
    decode_tokens = context = copied = 0
    start = 0  # position in running of the requests still to go
    while True:
        rows = state.running.rows[start:]
        kv = r.kv_tokens[rows]
        left = r.prefill_target[rows] - kv
        # Positions (in rows) of the decodes within budget.
        decoding = (left <= 0).nonzero()[0][: max(budget, 0)]
        segment, decoded = rows, kv
        if len(decoding) < len(rows):
            segment, decoded = rows[decoding], kv[decoding]
        # Positions (in segment) of the decodes that need a new block.
        growing = (decoded >= r.gpu_blocks[segment] * state.block_size).nonzero()[0]
        free = state.free_gpu
        blocked = len(growing) > free
        stop = len(rows)
        if blocked:
            first = int(growing[free])
            stop = int(decoding[first])
            segment, decoded, growing = segment[:first], decoded[:first], growing[:free]
        if len(growing):
            r.gpu_blocks[segment[growing]] += 1
            state.free_gpu -= len(growing)
        decoded = decoded + 1
        r.kv_tokens[segment] = decoded
        decoders.append(segment)
        decode_tokens += len(segment)
        context += int(decoded.sum())
        budget -= len(segment)
        if len(segment) < stop:
            prefilling = (left[:stop] > 0).nonzero()[0]
            pending.append(rows[prefilling])
            pending_left.append(left[prefilling])
        if not blocked:
            break
        row = int(rows[stop])
        grown, moved = state.grow(row, swaps)
        copied += moved
        if grown:
            r.kv_tokens[row] = kv[stop] + 1
            decoders.append(rows[stop : stop + 1])
            decode_tokens += 1
            context += int(kv[stop]) + 1
            budget -= 1
        start += stop + 1
    emitting = decoders[0] if len(decoders) == 1 else np.concatenate(decoders)
    decodes = Batch(0, decode_tokens, context, emitting, copied, _NONE, _NONE)
    if not pending:
        return decodes
    return _with_prefills(
        state,
        decodes,
        _joined(pending).tolist(),
        _joined(pending_left).tolist(),
        budget=budget,
        now_s=now_s,
        max_chunk=max_chunk,
    )


def _form_small_batch(
    state: EngineState, budget: int, now_s: float, swaps: bool, max_chunk: int | None
) -> Batch:
    """form_batch request by request: the same batch, the same moves in the
    same order (a pass over running up to a decode that finds no free
    block, that one grows by preempting, the next pass over what is left
    of running after it)."""
    kv_column = state.scalars.kv_tokens
    emitting: list[int] = []
    pending: list[int] = []
    pending_left: list[int] = []
    context = copied = 0
    start = 0  # position in running of the requests still to go
    passes = 0
    while True:
        passes += 1
        rows = state.running.rows[start:]
        each = rows.tolist()
        stop, context, budget = _decode_each(
            state, each, budget, context, emitting, pending, pending_left
        )
        if stop < 0:
            break
        row = each[stop]
        kv = kv_column[row]
        grown, moved = state.grow(row, swaps)
        copied += moved
        if grown:
            kv_column[row] = kv + 1
            emitting.append(row)
            context += kv + 1
            budget -= 1
        start += stop + 1
    decode_tokens = len(emitting)
    if passes == 1 and decode_tokens == len(rows):
        # Everyone decoded: the batch's rows are running's, in order.
        decoding = rows
    else:
        decoding = state.last_emitting.array(emitting)
    decodes = Batch(0, decode_tokens, context, decoding, copied, _NONE, _NONE)
    if not pending:
        return decodes
    return _with_prefills(
        state, decodes, pending, pending_left, budget=budget, now_s=now_s, max_chunk=max_chunk
    )


def form_batch_of(
    state: EngineState, rows: list[int], budget: int, now_s: float, max_chunk: int | None
) -> Batch:
    """The batch form_batch forms were running these rows alone (running
    rows, in this order; the others held back), when the free GPU blocks
    hold a new block for each of them (state.free_gpu >= len(rows)): then
    no decode preempts, and the running rows need not be filtered and put
    back."""
    if state.free_gpu < len(rows):
        raise ValueError(f"{len(rows)} rows may need more than the {state.free_gpu} free blocks")
    emitting: list[int] = []
    pending: list[int] = []
    pending_left: list[int] = []
    _, context, budget = _decode_each(state, rows, budget, 0, emitting, pending, pending_left)
    decodes = Batch(0, len(emitting), context, state.last_emitting.array(emitting), 0, _NONE, _NONE)
    if not pending:
        return decodes
    return _with_prefills(
        state, decodes, pending, pending_left, budget=budget, now_s=now_s, max_chunk=max_chunk
    )


def _decode_each(  # noqa: PLR0917
    state: EngineState,
    rows: list[int],
    budget: int,
    context: int,
    emitting: list[int],
    pending: list[int],
    pending_left: list[int],
) -> tuple[int, int, int]:
    """One pass over running rows, request by request: each that has
    finished its prefill decodes a token while the budget lasts (into
    emitting, a new block taken when its KV fills its last one), the others
    go to pending with the prefill tokens they have left. Stops at the
    first decode that finds no free block. Returns that decode's position
    in rows (-1: none), the context and the budget after the pass."""
    scalars = state.scalars
    kv_column = scalars.kv_tokens
    targets = scalars.prefill_target
    gpu_blocks = scalars.gpu_blocks
    block_size = state.block_size
    free = state.free_gpu
    for row in rows:
        kv = kv_column[row]
        left = targets[row] - kv
        if left > 0:
            pending.append(row)
            pending_left.append(left)
            continue
        if budget <= 0:
            continue
        blocks = gpu_blocks[row]
        if kv >= blocks * block_size:
            if free <= 0:
                state.free_gpu = free
                return rows.index(row), context, budget
            gpu_blocks[row] = blocks + 1
            free -= 1
        kv_column[row] = kv + 1
        emitting.append(row)
        context += kv + 1
        budget -= 1
    state.free_gpu = free
    return -1, context, budget


def whole_prefills(state: EngineState, now_s: float) -> Batch | None:
    """A batch of every running request's whole prefill, alone (no decode),
    when some running request has one to do; None otherwise."""
    r = state.requests
    rows = state.running.rows
    left = r.prefill_target[rows] - r.kv_tokens[rows]
    prefilling = (left > 0).nonzero()[0]
    if not len(prefilling):
        return None
    left = left[prefilling]
    return _with_prefills(
        state,
        Batch(0, 0, 0, _NONE, 0, _NONE, _NONE),
        rows[prefilling].tolist(),
        left.tolist(),
        budget=int(left.sum()),
        now_s=now_s,
        max_chunk=None,
    )


def _joined(parts: list[IntArray]) -> IntArray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _with_prefills(
    state: EngineState,
    decodes: Batch,
    rows: list[int],
    left: list[int],
    *,
    budget: int,
    now_s: float,
    max_chunk: int | None,
) -> Batch:
    """The batch of decodes with chunks of what is left of the budget for
    prefilling rows (left tokens to go each), in order: their tokens, their
    requests' KV after them in the context, the rows whose prefill completes
    after the decodes in emitting. The budget runs out after a few prompts,
    so request by request."""
    r = state.requests
    prefix = state.prefix
    prefill = context = 0
    done: list[int] = []
    chunks: list[int] = []
    cap = budget if max_chunk is None else max_chunk
    own_caps = r.chunk_tokens
    kv_column = state.scalars.kv_tokens
    for row, to_go in zip(rows, left, strict=True):
        if budget <= 0:
            break
        own = own_caps.item(row)
        chunk = min(to_go, budget, cap) if own == 0 else min(to_go, budget, cap, own)
        kv = kv_column[row] + chunk
        kv_column[row] = kv
        if prefix is not None:
            prefix.computed(row, kv)
        r.last_prefill_s[row] = now_s
        budget -= chunk
        prefill += chunk
        context += kv
        chunks.append(chunk)
        if chunk == to_go:
            done.append(row)
    emitting = decodes.emitting
    return decodes._replace(
        prefill_tokens=prefill,
        context_tokens=decodes.context_tokens + context,
        emitting=np.concatenate((emitting, np.array(done, dtype=np.int64))) if done else emitting,
        prefill_rows=np.array(rows[: len(chunks)], dtype=np.int64),
        prefill_chunks=np.array(chunks, dtype=np.int64),
    )
