"""Where every request and every KV block is, and the only moves between
those places: arrive, admit, preempt (by swap or recompute), swap in, eager
copies, grow by a block, emit and finish (and quiet stretches of decoding),
rejection, and, where a topology wires several engines over one set of
request columns, a request handed to another engine or leaving them all to
wait in the topology's own queue (and joining one again). Each move keeps the block
pools conserved (free plus held equals the pool) and each request in the one
queue of its phase.

With a prefix cache (planner.replay.prefix_cache) a block of prompt KV that
several requests share is held once: a start references the cached blocks
its prompt begins with and prefills only the rest, every release (finish,
preemption by swap or by recompute) gives up the request's references, so a
shared block stays on the GPU while another request holds it, and a resume
from CPU re-uses the blocks still cached and copies in only the others."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from planner.replay.last_rows import LastRows
from planner.replay.prefix_cache import PrefixCache
from planner.replay.queues import RequestQueue
from planner.replay.scalar_columns import ScalarColumns
from planner.replay.state import (
    IntArray,
    Phase,
    RequestColumns,
    blocks_needed,
    blocks_needed_one,
)
from planner.replay.tokens import TokenTimes

QUEUED = np.int8(Phase.QUEUED)
RUNNING = np.int8(Phase.RUNNING)
ROTARY = np.int8(Phase.ROTARY)
IN_TRANSIT = np.int8(Phase.IN_TRANSIT)
FINISHED = np.int8(Phase.FINISHED)
REJECTED = np.int8(Phase.REJECTED)
_NONE: IntArray = np.zeros(0, dtype=np.int64)
# Rows from which emit works on whole columns; fewer go request by request.
SMALL_EMIT = 8


class EngineState:
    """The requests' columns, the four queues, the free blocks of both pools
    and the run's preemption counters.

    Engines wired over one set of request columns share their token times
    (tokens). Two hooks for such wirings: rows in `pinned` are never chosen
    to be preempted for a block (a request being copied to another engine),
    and a row in `not_before_s` runs in no iteration that starts before that
    time (a request handed over from an engine whose iteration emitting its
    last token ends later)."""

    def __init__(
        self,
        requests: RequestColumns,
        gpu_blocks: int,
        cpu_blocks: int,
        block_size: int,
        *,
        prefix: PrefixCache | None = None,
        tokens: TokenTimes | None = None,
    ) -> None:
        self.requests = requests
        self.prefix = prefix
        self.block_size = block_size
        self.free_gpu = gpu_blocks
        self.free_cpu = cpu_blocks
        self.queued = RequestQueue(Phase.QUEUED)
        self.running = RequestQueue(Phase.RUNNING)  # by admission (or resumption)
        self.rotary = RequestQueue(Phase.ROTARY)  # by preemption
        self.in_transit = RequestQueue(Phase.IN_TRANSIT)
        self.tokens = tokens if tokens is not None else TokenTimes(requests.output_tokens)
        self.scalars = ScalarColumns(requests)
        self.last_emitting = LastRows()
        self.preemptions = 0
        self.swap_outs = 0
        self.swap_ins = 0
        self.finished = 0
        self.pinned: set[int] = set()
        self.not_before_s: dict[int, float] = {}

    def active(self) -> bool:
        return bool(
            len(self.queued.rows)
            or len(self.running.rows)
            or len(self.rotary.rows)
            or len(self.in_transit.rows)
        )

    def arrive(self, rows: IntArray, rejected: IntArray) -> None:
        r = self.requests
        r.phase[rejected] = REJECTED
        r.phase[rows] = QUEUED
        r.start_blocks[rows] = blocks_needed(r, rows, self.block_size)
        self.queued.extend(rows)

    # -- a request handed to another engine -----------------------------------

    def hand_over(self, rows: IntArray, to: EngineState, front: bool = False) -> None:
        """Queued or running rows leave for engine `to`, joining the end (or,
        queued ones with front, the head) of their queue there in the order
        given; running ones take their GPU blocks with them. The caller
        checks that `to` has the blocks."""
        if not len(rows):
            return
        r = self.requests
        phase = r.phase[rows]
        running = rows[phase == RUNNING]
        queued = rows[phase == QUEUED]
        if len(running):
            blocks = int(r.gpu_blocks[running].sum())
            self.free_gpu += blocks
            to.free_gpu -= blocks
            self.running.rows = self.running.rows[~np.isin(self.running.rows, running)]
            to.running.extend(running)
            for row in running.tolist():
                self.pinned.discard(row)
                ready_s = self.not_before_s.pop(row, None)
                if ready_s is not None:
                    to.not_before_s[row] = ready_s
        if len(queued):
            self.queued.rows = self.queued.rows[~np.isin(self.queued.rows, queued)]
            if front:
                to.queued.push_front(queued)
            else:
                to.queued.extend(queued)

    def order_running_by_admission(self) -> None:
        """Running rows by their latest admission (then row): after requests
        from several engines joined, the tail is again the latest admitted."""
        rows = self.running.rows
        self.running.rows = rows[np.lexsort((rows, self.requests.admitted_at_s[rows]))]

    def resize_gpu(self, blocks: int) -> None:
        """The GPU pool grows (or shrinks, if that many are free) by blocks."""
        self.free_gpu += blocks

    def held_back(self, now_s: float) -> IntArray:
        """The running rows that may not run in an iteration starting at now_s
        (not_before_s); the others are forgotten there."""
        waiting = {row: t for row, t in self.not_before_s.items() if t > now_s}
        self.not_before_s = waiting
        if not waiting:
            return _NONE
        running = self.running.rows
        held: IntArray = running[np.isin(running, np.fromiter(waiting, np.int64, len(waiting)))]
        return held

    def admit(self, rows: Sequence[int], needs: Sequence[int], now_s: float) -> None:
        """Queued rows start running with the blocks they need."""
        r = self.requests
        idx = np.array(rows, dtype=np.int64)
        r.phase[idx] = RUNNING
        r.gpu_blocks[idx] = needs
        if self.prefix is None:
            self.free_gpu -= sum(needs)
        else:
            for row, need in zip(rows, needs, strict=True):
                hits, shared = self.prefix.start(
                    row, int(r.prompt_tokens[row]), int(r.prefill_target[row]), self.free_gpu
                )
                self.free_gpu -= need - shared
                r.kv_tokens[row] = hits * self.block_size
        r.run_start_s[idx] = now_s
        r.admitted_at_s[idx] = now_s
        self.queued.drop_departed(r.phase, leaving=idx)
        self.running.extend(idx)

    def start_running(self, now_s: float) -> None:
        """Requests swapped in during the last iteration run from now."""
        rows = self.in_transit.take_all()
        if len(rows):
            self.requests.phase[rows] = RUNNING
            self.requests.run_start_s[rows] = now_s
            self.running.extend(rows)

    def preempt(self, rows: Sequence[int], swap: bool, *, counted: bool = True) -> int:
        """Preempt running rows, in order (others are skipped): by swap (the
        KV goes to CPU memory; only blocks without a CPU copy are copied) or by
        recompute (the KV is dropped; the request re-queues at the head and
        recomputes its prompt and the tokens generated so far). A swap falls
        back to recompute when the CPU pool cannot take the blocks, or when
        nothing is computed yet (which loses nothing). Returns blocks copied
        out. A few at a time: request by request. counted: whether each
        counts as the request's preemption (False: a swap for KV room that
        the topology counts as a swap-out only)."""
        r = self.requests
        phase = r.phase
        swapped: list[int] = []
        dropped: list[int] = []
        copied = 0
        for row in rows:
            if phase[row] != RUNNING:
                continue
            gpu = int(r.gpu_blocks[row])
            dirty = gpu - int(r.synced_blocks[row])
            kv = int(r.kv_tokens[row])
            self.free_gpu += self._released(row, gpu)
            r.gpu_blocks[row] = r.synced_blocks[row] = 0
            if counted:
                r.preemptions[row] += 1
            if swap and dirty <= self.free_cpu and kv != 0:
                self.free_cpu -= dirty
                copied += dirty
                r.cpu_blocks[row] += dirty
                r.swap_outs[row] += 1
                r.start_blocks[row] = blocks_needed_one(
                    kv, int(r.prefill_target[row]), self.block_size
                )
                phase[row] = ROTARY
                swapped.append(row)
            else:
                self.free_cpu += int(r.cpu_blocks[row])
                r.cpu_blocks[row] = r.kv_tokens[row] = 0
                r.recomputed_tokens[row] += kv
                target = int(r.prompt_tokens[row] + r.generated[row])
                r.prefill_target[row] = target
                r.start_blocks[row] = blocks_needed_one(0, target, self.block_size)
                phase[row] = QUEUED
                dropped.append(row)
        if swapped:
            self.rotary.extend(np.array(swapped, dtype=np.int64))
            self.swap_outs += len(swapped)
        if dropped:
            # Each goes to the head in turn: the last preempted is first.
            self.queued.push_front(np.array(dropped[::-1], dtype=np.int64))
        if swapped or dropped:
            if counted:
                self.preemptions += len(swapped) + len(dropped)
            self.running.drop_departed(phase)
        return copied

    # -- rows waiting outside every engine (a topology's own queue) ----------

    def leave(self, rows: Sequence[int], now_s: float, *, preempted: bool) -> None:
        """Rows leave this engine for a wait outside every engine (the
        topology's own queue), keeping their progress: running ones (and
        those being swapped in) with their KV swapped out first (by
        recompute when none is computed yet), queued and rotary ones as they
        are; their CPU blocks go with them. With preempted each counts a
        preemption."""
        if not rows:
            return
        r = self.requests
        idx = np.array(rows, dtype=np.int64)
        if len(self.in_transit.rows) and (r.phase[idx] == IN_TRANSIT).any():
            # Their KV is on its way in: it runs from now, then goes back out.
            self.start_running(now_s)
        on_gpu = idx[r.phase[idx] == RUNNING]
        if len(on_gpu):
            self.preempt(on_gpu.tolist(), swap=True, counted=preempted)
        if preempted:
            resting = idx[~np.isin(idx, on_gpu)]
            r.preemptions[resting] += 1
            self.preemptions += len(resting)
        self.free_cpu += int(r.cpu_blocks[idx].sum())
        self.queued.rows = self.queued.rows[~np.isin(self.queued.rows, idx)]
        self.rotary.rows = self.rotary.rows[~np.isin(self.rotary.rows, idx)]

    def join(self, rows: Sequence[int]) -> None:
        """Rows from a wait outside every engine (new ones, queued or rotary)
        join the end of their queue here, rotary ones with their CPU blocks."""
        if not rows:
            return
        r = self.requests
        idx = np.array(rows, dtype=np.int64)
        phase = r.phase[idx]
        queued = idx[phase != ROTARY]
        rotary = idx[phase == ROTARY]
        if len(queued):
            r.phase[queued] = QUEUED
            r.start_blocks[queued] = blocks_needed(r, queued, self.block_size)
            self.queued.extend(queued)
        if len(rotary):
            self.free_cpu -= int(r.cpu_blocks[rotary].sum())
            self.rotary.extend(rotary)

    def reject(self, rows: Sequence[int]) -> None:
        """Rows (queued, running or rotary) are given up unfinished: they
        leave the engine and free their blocks."""
        if not rows:
            return
        r = self.requests
        idx = np.array(rows, dtype=np.int64)
        for row in idx[r.phase[idx] == RUNNING].tolist():
            self.free_gpu += self._released(row, int(r.gpu_blocks[row]))
        self.free_cpu += int(r.cpu_blocks[idx].sum())
        r.gpu_blocks[idx] = r.cpu_blocks[idx] = r.synced_blocks[idx] = 0
        r.phase[idx] = REJECTED
        for queue in (self.queued, self.running, self.rotary):
            queue.drop_departed(r.phase)

    def start_cost(self, row: int, need: int, phase: int) -> tuple[int, int]:
        """Blocks queued (or rotary) row would take from the free count to
        start with `need` blocks, and the prompt tokens it finds cached:
        blocks a prefix cache shares with running requests cost nothing."""
        if self.prefix is None:
            return need, 0
        r = self.requests
        if phase == Phase.ROTARY:
            return self.prefix.resume_cost(row, need, int(r.kv_tokens[row]), self.free_gpu), 0
        if phase != Phase.QUEUED:
            return need, 0
        return self.prefix.start_cost(row, need, int(r.prefill_target[row]), self.free_gpu)

    def _released(self, row: int, blocks: int) -> int:
        """Blocks freed when row gives up its `blocks` GPU blocks."""
        if self.prefix is None:
            return blocks
        return self.prefix.release(row, blocks, self.free_gpu)

    def swap_in(self, rows: Sequence[int], needs: Sequence[int], keep_cpu_copies: bool) -> int:
        """Rotary rows get the blocks they need and their KV travels in during
        this iteration; returns blocks copied in. With keep_cpu_copies their
        full blocks keep their CPU copies (SYNCED); the rest of their CPU
        blocks are freed."""
        r = self.requests
        idx = np.array(rows, dtype=np.int64)
        r.phase[idx] = IN_TRANSIT
        need = np.array(needs, dtype=np.int64)
        cpu = r.cpu_blocks[idx]
        reused = 0
        if self.prefix is None:
            self.free_gpu -= int(need.sum())
        else:
            for row, blocks in zip(rows, needs, strict=True):
                hit, shared = self.prefix.resume(row, int(r.kv_tokens[row]), self.free_gpu)
                self.free_gpu -= blocks - shared
                reused += hit
        r.gpu_blocks[idx] = need
        if keep_cpu_copies:
            synced = np.minimum(np.minimum(r.kv_tokens[idx] // self.block_size, need), cpu)
        else:
            synced = np.zeros_like(cpu)
        self.free_cpu += int((cpu - synced).sum())
        r.cpu_blocks[idx] = synced
        r.synced_blocks[idx] = synced
        self.rotary.drop_departed(r.phase)
        self.in_transit.extend(idx)
        self.swap_ins += len(idx)
        r.swap_ins[idx] += 1
        return int(cpu.sum()) - reused

    def eager(self, budget: int, order: IntArray | None = None) -> int:
        """DuplexKV eager copies: newly full blocks of running requests,
        longest running first, become SYNCED, within budget and the free CPU
        blocks. Returns blocks copied. order: the running rows in that order
        (eager_order), when the caller has them already."""
        cap = min(budget, self.free_cpu)
        rows = self.running.rows
        if cap <= 0 or not len(rows):
            return 0
        r = self.requests
        full = np.minimum(r.kv_tokens[rows] // self.block_size, r.gpu_blocks[rows])
        synced = r.synced_blocks[rows]
        fresh = np.maximum(full - synced, 0)
        total = int(fresh.sum())
        if total <= cap:
            # Every fresh block fits: who goes first does not matter.
            r.synced_blocks[rows] = synced + fresh
            r.cpu_blocks[rows] += fresh
            self.free_cpu -= total
            return total
        rows = order if order is not None else self.eager_order()
        full = np.minimum(r.kv_tokens[rows] // self.block_size, r.gpu_blocks[rows])
        fresh = np.maximum(full - r.synced_blocks[rows], 0)
        before = fresh.cumsum() - fresh
        copy = np.minimum(fresh, np.maximum(cap - before, 0))
        r.synced_blocks[rows] += copy
        r.cpu_blocks[rows] += copy
        copied = int(copy.sum())
        self.free_cpu -= copied
        return copied

    def eager_order(self) -> IntArray:
        """The running rows, longest running first (then by row)."""
        rows = self.running.rows
        ordered: IntArray = rows[np.lexsort((rows, self.requests.run_start_s[rows]))]
        return ordered

    def grow(self, row: int, swaps: bool) -> tuple[bool, int]:
        """One more block for row, preempting the most recently admitted
        running requests not pinned (by swap, or recompute) while none is
        free. Returns
        whether row got it (False when row itself had to go) and the blocks
        the preemptions copied out."""
        copied = 0
        while self.free_gpu == 0:
            victim = self._victim()
            if victim is None:
                return False, copied
            before = self.free_gpu
            copied += self.preempt([victim], swaps)
            if victim == row or self.free_gpu == before:
                return False, copied
        self.free_gpu -= 1
        self.requests.gpu_blocks[row] += 1
        return True, copied

    def _victim(self) -> int | None:
        """The most recently admitted running row not pinned."""
        if not self.pinned:
            return self.running.last()
        for row in self.running.rows[::-1].tolist():
            if row not in self.pinned:
                return int(row)
        return None

    def quiet_growth(self, most: int) -> IntArray:
        """For a stretch of up to `most` quiet iterations from now, in which
        every running request decodes (none is prefilling) and none finishes:
        the blocks the decodes will have taken by the end of each, as long as
        they are free. Empty when not even one iteration is quiet."""
        r = self.requests
        rows = self.running.rows
        kv = r.kv_tokens[rows]
        if not len(rows) or (kv < r.prefill_target[rows]).any():
            return _NONE
        # The last token of the first to finish comes in a normal iteration.
        most = min(most, int((r.output_tokens[rows] - r.generated[rows]).min()) - 1)
        if most <= 0:
            return _NONE
        blocks = -(-(kv[:, None] + np.arange(1, most + 1)) // self.block_size)
        taken: IntArray = np.maximum(blocks - r.gpu_blocks[rows][:, None], 0).sum(axis=0)
        return taken[taken <= self.free_gpu]

    def decode_quietly(self, times_s: list[float]) -> None:
        """Every running request decodes and emits one token at each of
        times_s (quiet iterations, see quiet_growth), growing into new blocks
        as its KV crosses them."""
        r = self.requests
        rows = self.running.rows
        kv = r.kv_tokens[rows] + len(times_s)
        grown = np.maximum(-(-kv // self.block_size), r.gpu_blocks[rows])
        self.free_gpu -= int((grown - r.gpu_blocks[rows]).sum())
        r.gpu_blocks[rows] = grown
        r.kv_tokens[rows] = kv
        self.emit_quietly(times_s)

    def emit_quietly(self, times_s: list[float]) -> None:
        """Every running request emits one token at each of times_s (quiet
        iterations whose decodes are already in the KV and block columns)."""
        r = self.requests
        rows = self.running.rows
        generated = r.generated[rows]
        first = rows[generated == 0]
        if len(first):
            r.first_token_s[first] = times_s[0]
        self.tokens.record_each(rows, generated + 1, times_s)
        r.generated[rows] = generated + len(times_s)
        r.last_token_s[rows] = times_s[-1]

    def emit(self, rows: IntArray, now_s: float) -> None:
        """rows (all running) emit a token at now_s; those done finish and
        free their blocks."""
        r = self.requests
        if len(rows) < SMALL_EMIT:
            done = self._emit_each(rows, now_s)
        else:
            generated = r.generated[rows]
            first = rows[generated == 0]
            if len(first):
                r.first_token_s[first] = now_s
            generated += 1
            r.generated[rows] = generated
            self.tokens.record(rows, generated, now_s)
            r.last_token_s[rows] = now_s
            done = rows[generated >= r.output_tokens[rows]]
        if len(done):
            self.finished += len(done)
            r.phase[done] = FINISHED
            r.finish_s[done] = now_s
            if self.prefix is None:
                self.free_gpu += int(r.gpu_blocks[done].sum())
            else:
                for row, blocks in zip(done.tolist(), r.gpu_blocks[done].tolist(), strict=True):
                    self.free_gpu += self.prefix.release(row, blocks, self.free_gpu, finished=True)
            self.free_cpu += int(r.cpu_blocks[done].sum())
            r.gpu_blocks[done] = 0
            r.cpu_blocks[done] = 0
            r.synced_blocks[done] = 0
            self.running.drop_departed(r.phase)

    def _emit_each(self, rows: IntArray, now_s: float) -> IntArray:
        """emit's tokens request by request (a few rows); returns the rows
        done."""
        scalars = self.scalars
        generated = scalars.generated
        output_tokens = scalars.output_tokens
        first_token_s = scalars.first_token_s
        last_token_s = scalars.last_token_s
        each = self.last_emitting.rows(rows)
        before: list[int] = []
        done: list[int] = []
        for row in each:
            count = generated[row]
            if count == 0:
                first_token_s[row] = now_s
            generated[row] = count + 1
            last_token_s[row] = now_s
            if count + 1 >= output_tokens[row]:
                done.append(row)
            before.append(count)
        self.tokens.record_rows(each, before, now_s)
        return np.array(done, dtype=np.int64) if done else _NONE
