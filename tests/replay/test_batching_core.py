"""The batching core's options and hooks for topologies that wire several
cores over one set of request columns (planner.replay.batching_core,
engine_state): the prefill's causal attention pairs in the cost, a chunk
cap (the engine's and a request's own), empty iterations that take no
time, pinned requests, a ready time, requests handed to another core or
waiting outside every core, whole prefills alone, and a KV-residency
strategy that pauses requests and times the iterations."""

from __future__ import annotations

import numpy as np

from planner.domain.requests import Slo
from planner.replay.batch import Batch
from planner.replay.batching_core import BatchingCore, EngineConfig
from planner.replay.engine_state import EngineState
from planner.replay.kv_residency import ResidentIteration
from planner.replay.schedulers import Fcfs
from planner.replay.state import IntArray, Phase, RequestColumns
from planner.trace.records import TraceRequest


class RecordingCost:
    """Every iteration with tokens takes 0.01 s; records its arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, ...]] = []

    def iteration_time_s(
        self,
        prefill_tokens: int,
        decode_tokens: int,
        attended_context_tokens: int,
        prefill_attention_pairs: int = 0,
    ) -> float:
        self.calls.append(
            (prefill_tokens, decode_tokens, attended_context_tokens, prefill_attention_pairs)
        )
        return 0.01 if prefill_tokens + decode_tokens else 0.0


def columns(*prompts: int, output: int = 4) -> RequestColumns:
    trace = [
        TraceRequest(arrival_s=0.0, prompt_tokens=p, output_tokens=output, id=f"r{i}")
        for i, p in enumerate(prompts)
    ]
    return RequestColumns.from_trace(trace, Slo())


def core(
    requests: RequestColumns,
    cost: RecordingCost,
    blocks: int = 64,
    residency: PausingResidency | None = None,
    **options: object,
) -> BatchingCore:
    config = EngineConfig(
        gpu_kv_blocks=blocks,
        cpu_kv_blocks=0,
        block_bytes=1,
        block_size_tokens=16,
        **{"max_batched_tokens": 2048, **options},  # type: ignore[arg-type]
    )
    return BatchingCore(config, Fcfs(), cost, None, requests, pairs_cost=cost, residency=residency)


class PausingResidency:
    """Pauses the given rows in every decode batch; an iteration takes twice
    the cost model's time (half of it a stall), holds 7 blocks and fetches
    100 bytes."""

    def __init__(self, paused: list[int]) -> None:
        self.pause = np.array(paused, dtype=np.int64)
        self.seen: list[tuple[list[int], list[int]]] = []
        self.emitted_at: list[tuple[list[int], float]] = []

    def paused(self, state: EngineState, now_s: float) -> IntArray:
        running = state.running.rows
        held: IntArray = running[np.isin(running, self.pause)]
        self.seen.append((running.tolist(), held.tolist()))
        return held

    def timed(self, batch: Batch, compute_s: float) -> ResidentIteration:
        return ResidentIteration(2 * compute_s, compute_s, 7, 100)

    def emitted(self, state: EngineState, batch: Batch, now_s: float) -> None:
        self.emitted_at.append((batch.emitting.tolist(), now_s))


def arrive_all(c: BatchingCore) -> None:
    rows = np.arange(len(c.requests), dtype=np.int64)
    c.state.arrive(rows, rows[:0])


def test_prefill_attention_pairs_are_charged() -> None:
    cost = RecordingCost()
    c = core(columns(20, 10), cost)
    arrive_all(c)
    c._iteration()
    # Whole prompts from empty KV: n (n + 1) / 2 pairs each.
    assert cost.calls == [(30, 0, 30, 20 * 21 // 2 + 10 * 11 // 2)]
    c._iteration()
    assert cost.calls[-1] == (0, 2, 32, 0)


def test_chunks_are_capped_and_pairs_count_the_kv_before_them() -> None:
    cost = RecordingCost()
    c = core(columns(40), cost, max_chunk_tokens=16)
    arrive_all(c)
    c._iteration()
    c._iteration()
    # Second chunk: 16 tokens after 16 in the KV.
    assert cost.calls[1] == (16, 0, 32, 16 * 16 + 16 * 17 // 2)
    assert int(c.requests.kv_tokens[0]) == 32


def test_an_empty_iteration_takes_no_time_when_skipped() -> None:
    cost = RecordingCost()
    c = core(columns(20), cost, skips_empty_iterations=True, records_timeline=False)
    c.now_s = 5.0
    batch = c._iteration()
    assert batch.prefill_tokens == batch.decode_tokens == 0
    assert c.now_s == 5.0 and c._iterations == 0 and not cost.calls


def test_a_request_held_back_runs_from_its_ready_time() -> None:
    cost = RecordingCost()
    c = core(columns(20, 10), cost, skips_empty_iterations=True)
    arrive_all(c)
    c._iteration()  # both prefilled, t = 0.01
    c.state.not_before_s[0] = 0.5
    batch = c._iteration()
    assert batch.emitting.tolist() == [1]
    assert c.state.running.rows.tolist() == [0, 1]  # held in its place
    c.now_s = 0.5
    assert sorted(c._iteration().emitting.tolist()) == [0, 1]
    assert not c.state.not_before_s


def test_a_pinned_request_is_never_the_victim() -> None:
    # Two requests of one full block each, a third of 20 tokens in two
    # blocks, and no free block: the first's decode needs a block; the tail
    # (row 2) is pinned, so row 1 goes.
    cost = RecordingCost()
    c = core(columns(16, 16, 20), cost, blocks=4)
    arrive_all(c)
    c._iteration()
    c.state.pinned.add(2)
    c._iteration()
    r = c.requests
    assert r.phase.tolist() == [Phase.RUNNING, Phase.QUEUED, Phase.RUNNING]
    assert int(r.recomputed_tokens[1]) == 16  # the KV dropped
    assert c.state.free_gpu == 0


def test_no_victim_left_means_the_grower_waits() -> None:
    cost = RecordingCost()
    c = core(columns(16, 16), cost, blocks=2)
    arrive_all(c)
    c._iteration()
    c.state.pinned.update((0, 1))
    batch = c._iteration()
    assert batch.decode_tokens == 0
    assert c.requests.phase.tolist() == [Phase.RUNNING, Phase.RUNNING]


def test_hand_over_moves_requests_and_their_blocks() -> None:
    requests = columns(16, 40, 10)
    a = EngineState(requests, 10, 0, 16)
    b = EngineState(requests, 10, 0, 16, tokens=a.tokens)
    rows = np.arange(3, dtype=np.int64)
    a.arrive(rows, rows[:0])
    a.admit([0, 1], [1, 3], 0.0)
    a.not_before_s[1] = 2.0
    a.pinned.add(1)
    a.hand_over(np.array([1, 2], dtype=np.int64), b)
    assert (a.free_gpu, b.free_gpu) == (9, 7)
    assert a.running.rows.tolist() == [0] and a.queued.rows.tolist() == []
    assert b.running.rows.tolist() == [1] and b.queued.rows.tolist() == [2]
    assert b.not_before_s == {1: 2.0} and not a.not_before_s and not a.pinned
    b.hand_over(np.array([2], dtype=np.int64), a, front=True)
    assert a.queued.rows.tolist() == [2] and a.free_gpu + b.free_gpu == 20 - 4


def test_a_requests_own_chunk_cap_is_below_the_engines() -> None:
    cost = RecordingCost()
    c = core(columns(40, 40), cost, max_chunk_tokens=16)
    c.requests.chunk_tokens[0] = 10
    arrive_all(c)
    batch = c._iteration()
    assert batch.prefill_chunks.tolist() == [10, 16]


def test_rows_leave_every_engine_and_join_another_with_their_kv() -> None:
    requests = columns(16, 40, 10)
    a = EngineState(requests, 10, 8, 16)
    b = EngineState(requests, 10, 8, 16, tokens=a.tokens)
    rows = np.arange(3, dtype=np.int64)
    a.arrive(rows, rows[:0])
    a.admit([0, 1], [1, 3], 0.0)
    requests.kv_tokens[[0, 1]] = (16, 33)
    # A swap for room is a swap, not a preemption.
    a.preempt([0], swap=True, counted=False)
    assert (int(requests.swap_outs[0]), int(requests.preemptions[0]), a.preemptions) == (1, 0, 0)
    a.leave([0, 1, 2], 0.0, preempted=True)
    assert not a.active() and (a.free_gpu, a.free_cpu) == (10, 8)
    assert requests.phase.tolist() == [Phase.ROTARY, Phase.ROTARY, Phase.QUEUED]
    assert requests.preemptions.tolist() == [1, 1, 1]
    assert requests.cpu_blocks.tolist() == [1, 3, 0]
    b.join([0, 1, 2])
    assert b.rotary.rows.tolist() == [0, 1] and b.queued.rows.tolist() == [2]
    assert b.free_cpu == 4
    b.reject([1, 2])
    assert b.free_cpu == 7 and b.rotary.rows.tolist() == [0] and not len(b.queued.rows)
    assert requests.phase.tolist() == [Phase.ROTARY, Phase.REJECTED, Phase.REJECTED]


def test_prefills_alone_take_whole_prompts_and_decode_nobody() -> None:
    cost = RecordingCost()
    c = core(columns(20, 40), cost, max_batched_tokens=16, prefills_alone=True)
    c.state.arrive(np.array([0]), np.zeros(0, dtype=np.int64))
    c._iteration()
    c.state.arrive(np.array([1]), np.zeros(0, dtype=np.int64))
    c._iteration()
    c._iteration()
    # Each prompt whole despite the 16-token budget; row 0 waits out row 1's prefill.
    assert cost.calls == [(20, 0, 20, 20 * 21 // 2), (40, 0, 40, 40 * 41 // 2), (0, 2, 62, 0)]


def test_a_residency_pauses_requests_and_times_the_iteration() -> None:
    cost = RecordingCost()
    residency = PausingResidency([1])
    c = core(columns(20, 10), cost, residency=residency, prefills_alone=True)
    arrive_all(c)
    c._iteration()  # the prefill: the residency is not asked whom to pause
    assert residency.seen == []
    batch = c._iteration()
    assert residency.seen == [([0, 1], [1])]
    assert batch.emitting.tolist() == [0]
    assert c.state.running.rows.tolist() == [0, 1]  # row 1 keeps its place
    assert c.requests.generated.tolist() == [2, 1]
    # Timed by the residency: 0.02 s each (a 0.01 s stall), 7 blocks, 100 bytes.
    assert c.now_s == 0.04
    assert c._stall_s == 0.02 and c._bytes_h2d == 200 and c._peak_gpu == 7
    assert [t.gpu_kv_blocks_used for t in c.timeline] == [7, 7]
    assert residency.emitted_at == [([0, 1], 0.02), ([0], 0.04)]
