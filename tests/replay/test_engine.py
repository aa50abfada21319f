"""The simulated engine's accounting on tiny hand-checked traces: token times
(chunked prefill, then one decode per iteration), stalls, block pools checked
after every iteration, every request finished exactly once, determinism, and
requests that can never run."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.domain.rotation import RotationInputs, RotationParams
from planner.profiles.fit import LinearCost
from planner.profiles.link import LinkModel
from planner.replay.engine import (
    Engine,
    EngineConfig,
    admission_exits_s,
    front_end_passage_s,
    run_through_front_end,
)
from planner.replay.engine_events import EngineWiring
from planner.replay.events import Event, EventLoop
from planner.replay.records import ReplayResult
from planner.replay.scheduler_by_name import POLICY_NAMES, make_scheduler
from planner.replay.schedulers import EngineView, Fcfs, SchedulePlan
from planner.replay.state import Phase, blocks_needed
from planner.trace.records import TraceRequest

BLOCK_BYTES = 1000


class AffineCost:
    """10 ms per iteration + 1 ms per prefill token + 2 ms per decode token.
    With idle_zero an empty iteration takes no time (as the built-in cost
    model's does)."""

    def __init__(self, *, idle_zero: bool = False) -> None:
        self.idle_zero = idle_zero

    def iteration_time_s(
        self, prefill_tokens: int, decode_tokens: int, attended_context_tokens: int
    ) -> float:
        if self.idle_zero and prefill_tokens == 0 and decode_tokens == 0:
            return 0.0
        return 0.01 + 0.001 * prefill_tokens + 0.002 * decode_tokens


class Link:
    """Both directions share one pipe: (d2h + h2d) bytes / bandwidth."""

    def __init__(self, bytes_per_s: float = 1e6) -> None:
        self.bytes_per_s = bytes_per_s

    def transfer_time_s(self, d2h_bytes: int, h2d_bytes: int, segment_bytes: int) -> float:
        return (d2h_bytes + h2d_bytes) / self.bytes_per_s


def req(arrival_s: float, prompt: int, output: int, id: str | None = None) -> TraceRequest:
    return TraceRequest(arrival_s=arrival_s, prompt_tokens=prompt, output_tokens=output, id=id)


def config(
    gpu: int = 64,
    cpu: int = 64,
    *,
    bs: int = 16,
    budget: int = 2048,
    drain_limit_s: float = 3600.0,
) -> EngineConfig:
    return EngineConfig(
        gpu_kv_blocks=gpu,
        cpu_kv_blocks=cpu,
        block_bytes=BLOCK_BYTES,
        block_size_tokens=bs,
        max_batched_tokens=budget,
        drain_limit_s=drain_limit_s,
    )


def rotation_inputs() -> RotationInputs:
    return RotationInputs(params=RotationParams(transfer_budget_blocks=4))


class CheckedEngine(Engine):
    """Checks the block pools and the request lists after every iteration,
    and after every stretch of quiet iterations run in one step (counting
    the iterations it covers)."""

    checks = 0
    stretches = 0

    def _iteration(self) -> None:
        super()._iteration()
        check_state(self)
        self.checks += 1

    def _quiet_stretch(self, progress: Callable[[float], None] | None) -> bool:
        before = self._iterations
        if not super()._quiet_stretch(progress):
            return False
        check_state(self)
        self.checks += self._iterations - before
        self.stretches += 1
        return True


class OneByOneEngine(CheckedEngine):
    """Never runs quiet iterations in one step."""

    def _quiet_stretch(self, progress: Callable[[float], None] | None) -> bool:
        return False


def check_state(e: Engine) -> None:
    cfg = e.config
    bs = cfg.block_size_tokens
    s, r = e.state, e.requests
    assert 0 <= s.free_gpu <= cfg.gpu_kv_blocks
    assert 0 <= s.free_cpu <= cfg.cpu_kv_blocks
    # The pools are conserved: every block not free is some request's.
    assert (r.gpu_blocks >= 0).all() and (r.cpu_blocks >= 0).all()
    assert int(r.gpu_blocks.sum()) == cfg.gpu_kv_blocks - s.free_gpu
    assert int(r.cpu_blocks.sum()) == cfg.cpu_kv_blocks - s.free_cpu
    # Each request in the one list of its phase, once; nobody else listed.
    lists = {
        Phase.QUEUED: s.queued.rows,
        Phase.RUNNING: s.running.rows,
        Phase.ROTARY: s.rotary.rows,
        Phase.IN_TRANSIT: s.in_transit.rows,
    }
    listed = np.concatenate(list(lists.values())).tolist()
    assert len(set(listed)) == len(listed), "a request in two lists"
    for phase, rows in lists.items():
        assert sorted(rows.tolist()) == np.flatnonzero(r.phase == phase).tolist()
    # Every token counted was recorded once, in its place; only running
    # requests emit.
    assert s.tokens.recorded().tolist() == r.generated.tolist()
    assert (r.generated <= np.maximum(r.output_tokens, 1)).all()
    phase, kv, gpu, cpu = r.phase, r.kv_tokens, r.gpu_blocks, r.cpu_blocks
    on_gpu = (phase == Phase.RUNNING) | (phase == Phase.IN_TRANSIT)
    assert (gpu[on_gpu] >= 1).all()
    assert (kv <= gpu * bs)[on_gpu].all()
    assert (r.synced_blocks <= np.minimum(gpu, cpu))[on_gpu].all()
    assert (gpu[~on_gpu] == 0).all() and (r.synced_blocks[~on_gpu] == 0).all()
    # A rotary request has all the KV it wrote in CPU memory.
    rotary = phase == Phase.ROTARY
    assert (cpu >= -(-kv // bs))[rotary].all()
    queued = phase == Phase.QUEUED
    assert (kv[queued] == 0).all() and (cpu[queued] == 0).all()
    # What a waiting request needs to start, kept since it was queued or
    # swapped out, is still right.
    waiting = np.flatnonzero(queued | rotary)
    assert (r.start_blocks[waiting] == blocks_needed(r, waiting, bs)).all()
    finished = phase == Phase.FINISHED
    assert (r.generated == r.output_tokens)[finished].all()
    assert (cpu[finished] == 0).all()


def simulate(
    trace: Sequence[TraceRequest],
    cfg: EngineConfig,
    policy: str = "fcfs",
    *,
    cost: AffineCost | None = None,
    link: Link | None = None,
) -> tuple[CheckedEngine, ReplayResult]:
    engine = CheckedEngine(
        cfg,
        make_scheduler(policy, rotation_inputs()),
        cost if cost is not None else AffineCost(),
        link if link is not None else Link(),
        trace,
    )
    return engine, engine.run()


def check_all_finished(result: ReplayResult, trace: Sequence[TraceRequest]) -> None:
    assert len(result.requests) == len(trace)
    for t, o in zip(trace, result.requests, strict=True):
        times = o.token_times_s
        assert len(times) == t.output_tokens, o.id
        assert o.finish_s is not None and o.finish_s == times[-1]
        assert times[0] > t.arrival_s
        assert all(a <= b for a, b in itertools.pairwise(times))


def random_trace(seed: int, n: int = 30, rate: float = 50.0) -> list[TraceRequest]:
    """n requests ~1/rate s apart (20 ms), prompts 1..64 and outputs 1..48
    tokens: at most 7 blocks of 16 each, tight in a pool of 10."""
    rng = random.Random(seed)
    t = 0.0
    trace = []
    for i in range(n):
        t += rng.expovariate(rate)
        trace.append(req(round(t, 4), rng.randint(1, 64), rng.randint(1, 48), id=f"q{i}"))
    return trace


# -- token times by hand ---------------------------------------------------------


def test_single_request_chunked_prefill_then_one_decode_per_iteration() -> None:
    # 40-token prompt, budget 16: chunks of 16, 16, 8 (26, 26, 18 ms); the
    # first token ends the third iteration; then 12 ms per decode.
    _, result = simulate([req(1.0, 40, 3)], config(budget=16))
    (o,) = result.requests
    assert o.token_times_s == pytest.approx([1.070, 1.082, 1.094], abs=1e-12)
    assert o.token_times_s[0] - o.arrival_s == pytest.approx(0.070, abs=1e-12)  # TTFT
    gaps = [b - a for a, b in itertools.pairwise(o.token_times_s)]
    assert gaps == pytest.approx([0.012, 0.012], abs=1e-12)  # TBTs
    assert o.finish_s == o.token_times_s[-1]
    assert [s.prefill_tokens for s in result.timeline] == [16, 16, 8, 0, 0]
    assert [s.decode_tokens for s in result.timeline] == [0, 0, 0, 1, 1]
    assert [s.time_s for s in result.timeline] == pytest.approx(
        [1.026, 1.052, 1.070, 1.082, 1.094], abs=1e-12
    )
    assert [s.gpu_kv_blocks_used for s in result.timeline] == [3, 3, 3, 3, 0]
    totals = result.totals
    assert totals.iterations == 5
    assert totals.simulated_s == pytest.approx(1.094, abs=1e-12)
    assert totals.preemptions == totals.swap_outs == totals.swap_ins == 0
    assert totals.bytes_d2h == totals.bytes_h2d == 0 and totals.stall_s == 0.0
    assert o.preemptions == 0 and o.recomputed_tokens == 0


def test_prompt_within_budget_gives_the_first_token_after_one_iteration() -> None:
    _, result = simulate([req(0.0, 10, 4)], config())
    (o,) = result.requests
    assert o.token_times_s == pytest.approx([0.020, 0.032, 0.044, 0.056], abs=1e-12)


def test_single_output_token_finishes_with_the_prefill() -> None:
    _, result = simulate([req(0.5, 20, 1)], config())
    (o,) = result.requests
    assert o.token_times_s == pytest.approx([0.530], abs=1e-12)
    assert o.finish_s == o.token_times_s[0]
    assert result.totals.iterations == 1


def test_decodes_go_first_and_prefill_takes_what_is_left_of_the_budget() -> None:
    # A: 8-token prompt at 0 -> first token at 18 ms. B arrives at 15 ms and
    # joins the next iteration: A's decode (1 token) + B's chunk of 15 (27 ms,
    # ends at 45 ms); then A's decode + B's last 5 tokens (17 ms, ends at 62 ms:
    # A's third token and B's first); then B's decode (12 ms).
    trace = [req(0.0, 8, 3, id="A"), req(0.015, 20, 2, id="B")]
    _, result = simulate(trace, config(budget=16))
    a, b = result.requests
    assert a.token_times_s == pytest.approx([0.018, 0.045, 0.062], abs=1e-12)
    assert b.token_times_s == pytest.approx([0.062, 0.074], abs=1e-12)
    assert b.token_times_s[0] - b.arrival_s == pytest.approx(0.047, abs=1e-12)
    assert [(s.prefill_tokens, s.decode_tokens) for s in result.timeline] == [
        (8, 0),
        (15, 1),
        (5, 1),
        (0, 1),
    ]


def test_idle_engine_waits_for_the_next_arrival() -> None:
    trace = [req(0.0, 10, 1), req(5.0, 10, 1)]
    _, result = simulate(trace, config())
    first, second = result.requests
    assert first.token_times_s == pytest.approx([0.020], abs=1e-12)
    assert second.token_times_s == pytest.approx([5.020], abs=1e-12)
    assert result.totals.iterations == 2


def test_a_block_boundary_takes_a_new_block_and_counts_in_the_peak() -> None:
    # 48 tokens fill 3 blocks; the first decode writes token 49 into a fourth,
    # in the iteration that also finishes the request.
    engine, result = simulate([req(0.0, 48, 2)], config(gpu=4))
    assert result.requests[0].finish_s is not None
    assert result.totals.peak_gpu_kv_blocks == 4
    assert engine.state.free_gpu == 4


def test_transfers_that_do_not_fit_in_the_iteration_stall_it() -> None:
    # Pool of 4 blocks of 4 tokens. A (12 tokens, 3 blocks) runs; B (8 tokens,
    # 2 blocks) arrives; waiting-first swaps A out (3 blocks = 3000 B: 30 ms
    # at 100 kB/s, longer than B's 18 ms prefill: 12 ms stall). B then grows
    # into A's old room and finishes; A swaps back in during an otherwise
    # empty iteration (10 ms compute, 30 ms copy) and runs from the next.
    trace = [req(0.0, 12, 4, id="A"), req(0.001, 8, 2, id="B")]
    _, result = simulate(
        trace, config(gpu=4, cpu=10, bs=4, budget=64), "waiting-first", link=Link(1e5)
    )
    a, b = result.requests
    assert b.token_times_s == pytest.approx([0.052, 0.064], abs=1e-12)
    assert a.token_times_s == pytest.approx([0.022, 0.106, 0.118, 0.130], abs=1e-12)
    assert (a.swap_outs, a.swap_ins, a.preemptions, a.recomputed_tokens) == (1, 1, 1, 0)
    assert (b.swap_outs, b.preemptions) == (0, 0)
    totals = result.totals
    assert totals.bytes_d2h == totals.bytes_h2d == 3 * BLOCK_BYTES
    assert totals.stall_s == pytest.approx(0.012 + 0.020, abs=1e-12)
    assert [s.stall_s for s in result.timeline] == pytest.approx(
        [0.0, 0.012, 0.0, 0.020, 0.0, 0.0, 0.0], abs=1e-12
    )
    assert [s.rotary for s in result.timeline] == [0, 1, 1, 1, 0, 0, 0]


def test_transfers_within_the_iteration_cost_nothing() -> None:
    trace = [req(0.0, 12, 4, id="A"), req(0.001, 8, 2, id="B")]
    _, result = simulate(
        trace, config(gpu=4, cpu=10, bs=4, budget=64), "waiting-first", link=Link(1e6)
    )
    a, b = result.requests
    # 3 ms copies hide under 18 ms and 10 ms iterations.
    assert b.token_times_s == pytest.approx([0.040, 0.052], abs=1e-12)
    assert a.token_times_s == pytest.approx([0.022, 0.074, 0.086, 0.098], abs=1e-12)
    assert result.totals.stall_s == 0.0


# -- pools, completion, determinism on random traces -------------------------------


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("seed", [1, 2])
def test_tight_pool_never_overflows_and_every_request_finishes(policy: str, seed: int) -> None:
    trace = random_trace(seed)
    engine, result = simulate(trace, config(gpu=10, cpu=12, budget=32), policy)
    assert engine.checks == result.totals.iterations > 0
    check_all_finished(result, trace)
    assert engine.state.free_gpu == 10 and engine.state.free_cpu == 12
    assert (engine.requests.phase == Phase.FINISHED).all()
    totals = result.totals
    assert totals.peak_gpu_kv_blocks <= 10
    assert all(0 <= s.gpu_kv_blocks_used <= 10 for s in result.timeline)
    assert all(0 <= s.cpu_kv_blocks_used <= 12 for s in result.timeline)
    # The pool is tight enough that the policy had to preempt, and nothing was
    # lost doing so.
    assert totals.preemptions > 0
    assert totals.preemptions == sum(o.preemptions for o in result.requests)
    assert totals.swap_outs == sum(o.swap_outs for o in result.requests)
    assert totals.swap_ins == sum(o.swap_ins for o in result.requests)
    if not engine.scheduler.swaps:
        # The engine's own preemptions recompute (lvf-vllm swaps only a
        # plan's victims, fcfs never).
        assert sum(o.recomputed_tokens for o in result.requests) > 0
        if policy in ("fcfs", "fcfs-vllm"):
            assert totals.swap_outs == totals.swap_ins == 0 and totals.bytes_d2h == 0
    else:
        assert totals.swap_outs > 0 and totals.swap_ins > 0
        assert totals.bytes_h2d > 0 and totals.bytes_d2h > 0


@pytest.mark.parametrize("policy", ["waiting-first", "swapped-first", "lvf"])
def test_no_cpu_pool_preempts_by_recompute(policy: str) -> None:
    trace = random_trace(3)
    engine, result = simulate(trace, config(gpu=10, cpu=0, budget=32), policy)
    check_all_finished(result, trace)
    assert result.totals.swap_outs == 0 and result.totals.bytes_d2h == 0
    assert engine.state.free_cpu == 0


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_two_runs_give_identical_outcomes(policy: str) -> None:
    trace = random_trace(4)
    _, first = simulate(trace, config(gpu=10, cpu=12, budget=32), policy)
    _, second = simulate(trace, config(gpu=10, cpu=12, budget=32), policy)
    assert first.requests == second.requests
    assert first.timeline == second.timeline
    t1, t2 = first.totals, second.totals
    assert (t1.iterations, t1.simulated_s, t1.preemptions, t1.bytes_d2h, t1.bytes_h2d) == (
        t2.iterations,
        t2.simulated_s,
        t2.preemptions,
        t2.bytes_d2h,
        t2.bytes_h2d,
    )


def test_outcomes_keep_trace_order_and_ids() -> None:
    trace = [req(0.0, 10, 2, id="x"), req(0.0, 10, 2), req(0.1, 5, 1, id="z")]
    _, result = simulate(trace, config())
    assert [o.id for o in result.requests] == ["x", "r1", "z"]


def test_empty_trace() -> None:
    _, result = simulate([], config())
    assert result.requests == [] and result.totals.iterations == 0


# -- requests that can never run ---------------------------------------------------


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("idle_zero", [False, True])
def test_prompt_larger_than_the_gpu_pool_is_rejected_not_hung(policy: str, idle_zero: bool) -> None:
    # Pool: 4 blocks of 16 = 64 tokens. The 100-token prompt can never be
    # admitted: it is rejected on arrival, reported unfinished, and does not
    # block the requests behind it (waiting-first admits in queue order).
    trace = [
        req(0.0, 10, 3, id="before"),
        req(0.001, 100, 2, id="huge"),
        req(0.002, 10, 3, id="after"),
    ]
    engine, result = simulate(trace, config(gpu=4), policy, cost=AffineCost(idle_zero=idle_zero))
    before, huge, after = result.requests
    assert huge.token_times_s == [] and huge.finish_s is None
    assert engine.requests.phase[1] == Phase.REJECTED
    assert before.finish_s is not None and after.finish_s is not None
    assert result.totals.iterations < 20


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_prompt_plus_output_larger_than_the_pool_is_rejected(policy: str) -> None:
    # 60 + 10 - 1 = 69 tokens of KV at the last token: 5 blocks > 4. Admitted,
    # it would preempt itself forever when it outgrew the pool.
    engine, result = simulate([req(0.0, 60, 10)], config(gpu=4), policy)
    (o,) = result.requests
    assert o.token_times_s == [] and o.finish_s is None
    assert engine.requests.phase[0] == Phase.REJECTED
    assert result.totals.iterations == 0


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_request_filling_the_whole_pool_at_its_last_token_runs(policy: str) -> None:
    # 48 + 17 - 1 = 64 tokens: exactly the 4 blocks; the 48-token prompt
    # leaves one block to spare.
    engine, result = simulate([req(0.0, 48, 17)], config(gpu=4), policy)
    assert len(result.requests[0].token_times_s) == 17
    assert result.totals.peak_gpu_kv_blocks == 4 and result.totals.preemptions == 0
    assert engine.state.free_gpu == 4


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("idle_zero", [False, True])
def test_prompt_without_a_spare_block_is_rejected_under_every_policy(
    policy: str, idle_zero: bool
) -> None:
    # A 60-token prompt takes all 4 blocks, leaving none for the first decode
    # (the rotation policy would never start it and, first in line, it would
    # hold up everyone behind it): rejected on arrival by every policy alike.
    trace = [req(0.0, 60, 1, id="full"), req(1.0, 10, 2, id="small")]
    engine, result = simulate(trace, config(gpu=4), policy, cost=AffineCost(idle_zero=idle_zero))
    full, small = result.requests
    assert full.finish_s is None and full.token_times_s == []
    assert engine.requests.phase[0] == Phase.REJECTED
    assert small.token_times_s == pytest.approx([1.020, 1.032], abs=1e-12)
    assert result.totals.iterations == 2


def test_stuck_engine_stops_instead_of_spinning() -> None:
    # A scheduler that starts nothing: each iteration is empty (and free with
    # the zero-idle cost model). The engine idles to the next arrival, then
    # stops with everything unfinished.
    trace = [req(0.0, 10, 2), req(2.0, 10, 2)]
    engine = CheckedEngine(config(), NeverStart(), AffineCost(idle_zero=True), Link(), trace)
    result = engine.run()
    assert all(o.finish_s is None for o in result.requests)
    assert result.totals.iterations == 2
    assert result.totals.simulated_s == 2.0
    assert len(engine.state.queued) == 2


class NeverStart:
    name = "never"
    swaps = False
    keeps_cpu_copies = False
    in_order = True
    idle_unless_waiting = True
    copies_only_unless_waiting = False
    running_first = False
    starts_queue_only = False

    def plan(self, view: EngineView) -> SchedulePlan:
        return SchedulePlan()


def test_an_iteration_that_only_swaps_out_is_not_a_stall() -> None:
    # After its second token the scheduler swaps A out and starts nothing:
    # that iteration emits no token and leaves nothing running (10 ms, the
    # 1 ms copy hidden under it), yet its blocks are free now. The next one
    # swaps A back in, and A finishes.
    trace = [req(0.0, 10, 4, id="a")]
    engine = CheckedEngine(config(), SwapOutOnce(), AffineCost(), Link(), trace)
    result = engine.run()
    (a,) = result.requests
    assert a.token_times_s == pytest.approx([0.020, 0.032, 0.064, 0.076], abs=1e-12)
    assert (a.swap_outs, a.swap_ins) == (1, 1)
    assert result.totals.iterations == 6


class SwapOutOnce:
    """Starts whoever waits, and swaps the first request out once, after
    its second token, starting nobody in that iteration."""

    name = "swap-out-once"
    swaps = True
    keeps_cpu_copies = False
    in_order = True
    idle_unless_waiting = False
    copies_only_unless_waiting = False
    running_first = False
    starts_queue_only = False

    def __init__(self) -> None:
        self.swapped = False

    def plan(self, view: EngineView) -> SchedulePlan:
        running = view.running
        if not self.swapped and len(running) and view.requests.generated[running[0]] == 2:
            self.swapped = True
            return SchedulePlan(swap_out=running[:1])
        return SchedulePlan(start=np.concatenate((view.rotary, view.queued)))


def test_drain_limit_stops_the_run_with_requests_unfinished() -> None:
    # 12 ms per decode; stop 50 ms after the last arrival.
    engine, result = simulate([req(0.0, 10, 100)], config(drain_limit_s=0.05))
    (o,) = result.requests
    assert o.finish_s is None
    assert 0 < len(o.token_times_s) < 100
    assert 0.05 < result.totals.simulated_s <= 0.05 + 0.012 + 1e-12
    assert len(engine.state.running) == 1  # still holding its blocks when the run stopped


@pytest.mark.parametrize("policy", ["fcfs", "waiting-first", "swapped-first"])
def test_trace_order_does_not_matter_only_arrivals_do(policy: str) -> None:
    # The same requests listed in another order (distinct arrival times):
    # each one's outcome is the same, reported in the order given.
    trace = random_trace(5)
    shuffled = trace[::-1]
    _, result = simulate(trace, config(gpu=10, cpu=12, budget=32), policy)
    _, reversed_result = simulate(shuffled, config(gpu=10, cpu=12, budget=32), policy)
    assert [o.id for o in reversed_result.requests] == [t.id for t in shuffled]
    assert reversed_result.requests[::-1] == result.requests
    assert reversed_result.timeline == result.timeline


def check_same_as_one_by_one(
    trace: Sequence[TraceRequest], cfg: EngineConfig, policy: str, link: Link | None = None
) -> tuple[CheckedEngine, ReplayResult]:
    """Runs trace with quiet stretches and without; returns the first run
    after checking that both give exactly the same."""
    engine, result = simulate(trace, cfg, policy, link=link)
    plain = OneByOneEngine(
        cfg,
        make_scheduler(policy, rotation_inputs()),
        AffineCost(),
        link if link is not None else Link(),
        trace,
    )
    expected = plain.run()
    assert plain.checks == expected.totals.iterations
    assert result.requests == expected.requests
    assert result.timeline == expected.timeline
    assert dataclasses.replace(result.totals, wall_s=0.0) == dataclasses.replace(
        expected.totals, wall_s=0.0
    )
    return engine, result


class EventPerIterationLoop(EventLoop[EngineWiring]):
    """Lets no handler work in place, and counts the events pushed."""

    pushed = 0

    def in_place_before_s(self, priority: int) -> float:
        return -math.inf

    def push(self, event: Event[EngineWiring]) -> None:
        self.pushed += 1
        super().push(event)


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize(
    ("seed", "gpu", "rate", "drain_limit_s"),
    [(6, 10, 50.0, 3600.0), (7, 64, 5.0, 3600.0), (8, 64, 50.0, 3600.0), (9, 64, 50.0, 0.3)],
)
def test_iterations_run_in_place_as_one_event_each(
    policy: str, seed: int, gpu: int, rate: float, drain_limit_s: float
) -> None:
    # The engine's handler runs iterations (and quiet stretches) in place
    # while no other event is due: exactly what one EngineIterates event per
    # iteration gives, through the drain limit too.
    trace = random_trace(seed, rate=rate)
    cfg = config(gpu=gpu, cpu=12, budget=32, drain_limit_s=drain_limit_s)
    _, result = simulate(trace, cfg, policy)
    engine = Engine(cfg, make_scheduler(policy, rotation_inputs()), AffineCost(), Link(), trace)
    loop = engine._events = EventPerIterationLoop()
    expected = engine.run()
    assert loop.pushed > expected.totals.iterations
    assert result.requests == expected.requests
    assert result.timeline == expected.timeline
    assert dataclasses.replace(result.totals, wall_s=0.0) == dataclasses.replace(
        expected.totals, wall_s=0.0
    )


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize(("seed", "gpu", "rate"), [(6, 10, 50.0), (7, 64, 5.0), (8, 64, 50.0)])
def test_quiet_stretches_are_their_iterations_one_by_one(
    policy: str, seed: int, gpu: int, rate: float
) -> None:
    # Light traffic leaves stretches where nobody waits and everyone decodes
    # (ended by arrivals and finishes); run in one step, they give exactly
    # what iteration after iteration gives.
    engine, _ = check_same_as_one_by_one(
        random_trace(seed, rate=rate), config(gpu=gpu, cpu=12, budget=32), policy
    )
    assert engine.stretches > 0


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_a_quiet_stretch_ends_before_the_blocks_run_out(policy: str) -> None:
    # Two 20-token prompts take 2 of 10 blocks each and decode 90 tokens:
    # 60 decodes grow them to 5 blocks each, filling the pool; the 61st
    # needs a block none is free for, so a preemption follows in a normal
    # iteration.
    trace = [req(0.0, 20, 90, id="A"), req(0.0, 20, 90, id="B")]
    engine, result = check_same_as_one_by_one(trace, config(gpu=10, cpu=12), policy)
    assert engine.stretches > 0 and result.totals.preemptions > 0
    check_all_finished(result, trace)


def test_a_quiet_stretch_stops_at_the_drain_limit() -> None:
    trace = [req(0.0, 10, 400)]
    engine, result = check_same_as_one_by_one(trace, config(drain_limit_s=0.5), "fcfs")
    assert engine.stretches > 0
    assert 0.5 < result.totals.simulated_s <= 0.5 + 0.012 + 1e-12


@pytest.mark.parametrize("bytes_per_s", [1e6, 2e4])
def test_lvf_quiet_stretches_copy_eagerly_as_iterations_one_by_one(bytes_per_s: float) -> None:
    # lvf plans eager copies while nobody waits: its stretches ask it at
    # every iteration and make (and, on a slow link, stall for) the copies
    # as iteration after iteration does, the CPU pool filling up included.
    trace = [req(0.0, 40, 120, id="A"), req(0.0, 24, 100, id="B"), req(0.9, 8, 30, id="C")]
    link = Link(bytes_per_s)
    engine, result = check_same_as_one_by_one(trace, config(gpu=40, cpu=12), "lvf", link)
    assert engine.stretches > 0 and result.totals.bytes_d2h > 0
    assert (result.totals.stall_s > 0) == (bytes_per_s < 1e5)
    check_all_finished(result, trace)


def test_a_request_latency_adds_to_ttft_and_shifts_nothing_else():
    trace = [
        TraceRequest(arrival_s=0.1 * i, prompt_tokens=40 + 7 * i, output_tokens=5 + i, id=str(i))
        for i in range(6)
    ]
    cost = LinearCost(1e-3, 1e-5, 2e-4, 0.0)
    link = LinkModel.flat(10.0, 10.0, full_duplex=True)

    def run(latency_s: float):
        config = EngineConfig(
            gpu_kv_blocks=64, cpu_kv_blocks=0, block_bytes=1, request_latency_s=latency_s
        )
        return Engine(config, Fcfs(), cost, link, trace).run()

    plain, late = run(0.0), run(0.025)
    for a, b in zip(plain.requests, late.requests, strict=True):
        assert b.arrival_s == a.arrival_s
        assert b.token_times_s == pytest.approx([t + 0.025 for t in a.token_times_s])


def test_admission_exits_serve_one_request_at_a_time_in_arrival_order():
    # Two together, one while the queue is busy, one after it went idle;
    # the list need not be sorted (ties in the given order).
    assert admission_exits_s([0.0, 0.0, 0.05, 1.0], 0.02) == pytest.approx([0.02, 0.04, 0.07, 1.02])
    assert admission_exits_s([0.3, 0.0, 0.0], 0.1) == pytest.approx([0.4, 0.1, 0.2])
    assert admission_exits_s([], 0.1) == []


def test_an_admission_queue_spaces_a_burst_before_the_engine():
    # Three prompts arrive together; through a 50 ms queue they reach the
    # engine 50, 100 and 150 ms (plus the request latency) after arriving,
    # each prefilling on its own: each first token comes one iteration after
    # it left the queue. Latencies are still counted from the arrival.
    trace = [
        TraceRequest(arrival_s=0.0, prompt_tokens=40, output_tokens=2, id=str(i)) for i in range(3)
    ]
    cost = LinearCost(1e-3, 1e-5, 2e-4, 0.0)
    link = LinkModel.flat(10.0, 10.0, full_duplex=True)

    def run(admission_s: float):
        config = EngineConfig(
            gpu_kv_blocks=64,
            cpu_kv_blocks=0,
            block_bytes=1,
            request_latency_s=0.01,
            admission_s_per_request=admission_s,
        )
        return Engine(config, Fcfs(), cost, link, trace).run()

    together, queued = run(0.0), run(0.05)
    assert len({o.token_times_s[0] for o in together.requests}) == 1
    prefill_s = cost.iteration_time_s(40, 0, 0)
    for i, o in enumerate(queued.requests):
        assert o.arrival_s == 0.0
        assert o.token_times_s[0] == pytest.approx(0.01 + 0.05 * (i + 1) + prefill_s)
    with pytest.raises(ValueError, match="admission_s_per_request"):
        run(-0.01)


def test_a_front_end_serves_admissions_and_streamed_tokens_in_the_order_they_come():
    # Admissions take 10 ms, tokens 1 ms: the request entering at 0.1 waits
    # behind the five tokens streamed from 0.095 (the server is busy to 0.1),
    # the one at 0.5 finds it idle; a token at the same time as an admission
    # comes after it.
    tokens = [0.095] * 5 + [0.5]
    assert front_end_passage_s([0.0, 0.1, 0.5], 0.01, tokens, 0.001)[1] == pytest.approx(
        [0.01, 0.11, 0.51]
    )
    assert front_end_passage_s([0.0, 0.0999], 0.01, [0.05] * 20, 0.004)[1] == pytest.approx(
        [0.01, 0.05 + 20 * 0.004 + 0.01]
    )
    # Without streaming work it is the admission queue.
    entries = [0.0, 0.0, 0.05, 1.0]
    assert front_end_passage_s(entries, 0.02, [0.01, 0.03], 0.0)[1] == pytest.approx(
        admission_exits_s(entries, 0.02)
    )


def test_a_front_end_handles_each_engine_steps_output_once():
    # Five tokens of one step (one time) and one of another: with 3 ms per
    # step and nothing per token the request entering at 0.1 waits for one
    # step's output (to 0.098), not five tokens'.
    tokens = [0.095] * 5 + [0.5]
    assert front_end_passage_s([0.0, 0.1, 0.5], 0.01, tokens, 0.0, 0.003)[1] == pytest.approx(
        [0.01, 0.11, 0.51]
    )
    assert front_end_passage_s([0.0, 0.096], 0.01, tokens, 0.0, 0.003)[1] == pytest.approx(
        [0.01, 0.098 + 0.01]
    )
    # Both terms: the step's once, each token's on top.
    assert front_end_passage_s([0.096], 0.01, tokens, 0.001, 0.003)[1] == pytest.approx(
        [0.095 + 0.003 + 5 * 0.001 + 0.01]
    )


def test_a_request_is_tokenized_after_it_is_taken_up_behind_what_came_in_meanwhile():
    # Two requests at once, 10 ms admissions, 0.1 ms per prompt token: the
    # second is taken up after the first's admission (0.02), and the first's
    # tokenization (1 ms per 10 tokens, 100 tokens) waits behind it, then the
    # second's behind that: the k-th of a burst waits for k-1 tokenizations.
    taken, exits = front_end_passage_s(
        [0.0, 0.0], 0.01, [], 0.0, prompt_tokens=[100, 50], tokenize_s_per_token=1e-4
    )
    assert taken == pytest.approx([0.01, 0.02])
    assert exits == pytest.approx([0.03, 0.035])
    # A step's output (3 ms, at 0.015) comes in before the second's
    # tokenization and is served before it.
    taken, exits = front_end_passage_s(
        [0.0, 0.0], 0.01, [0.015], 0.0, 0.003, prompt_tokens=[100, 50], tokenize_s_per_token=1e-4
    )
    assert taken == pytest.approx([0.01, 0.02])
    assert exits == pytest.approx([0.03, 0.038])
    with pytest.raises(ValueError, match="prompt_tokens"):
        front_end_passage_s([0.0], 0.01, [], 0.0, tokenize_s_per_token=1e-4)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(0, 1), min_size=1, max_size=20),
    st.lists(st.floats(0, 1), max_size=40),
    st.floats(0, 0.01),
    st.floats(0, 0.01),
)
def test_without_tokenization_a_request_leaves_the_front_end_when_taken_up(
    entries: list[float], tokens: list[float], admission_s: float, step_s: float
) -> None:
    taken, exits = front_end_passage_s(entries, admission_s, tokens, 0.0, step_s)
    assert taken == exits
    with_tokenization = front_end_passage_s(
        entries,
        admission_s,
        tokens,
        0.0,
        step_s,
        prompt_tokens=[10] * len(entries),
        tokenize_s_per_token=1e-4,
    )
    # Tokenization only delays: taken up no earlier than the entry, out no
    # earlier than taken up plus the request's own tokenization.
    for entry, t, out in zip(entries, *with_tokenization, strict=True):
        assert entry + admission_s <= t + 1e-12
        assert t + 1e-3 <= out + 1e-12


def test_requests_wait_behind_the_steps_the_front_end_streams():
    trace = [
        TraceRequest(arrival_s=0.0, prompt_tokens=40, output_tokens=200, id="long"),
        TraceRequest(arrival_s=0.1, prompt_tokens=40, output_tokens=2, id="late"),
    ]
    cost = LinearCost(1e-3, 1e-5, 2e-4, 0.0)
    link = LinkModel.flat(10.0, 10.0, full_duplex=True)
    config = EngineConfig(
        gpu_kv_blocks=64,
        cpu_kv_blocks=0,
        block_bytes=1,
        admission_s_per_request=0.001,
        stream_s_per_step=0.002,
    )
    slow, passes, change_s = run_through_front_end(
        config,
        trace,
        lambda admitted_s: Engine(config, Fcfs(), cost, link, trace, admitted_s=admitted_s),
    )
    assert passes > 1 and change_s <= 1e-6
    tokens = [t for r in slow.requests for t in r.token_times_s]
    exits = front_end_passage_s([0.0, 0.1], 0.001, tokens, 0.0, 0.002)[1]
    assert exits[1] > 0.1 + 0.001
    assert exits[1] < slow.requests[1].token_times_s[0] < exits[1] + 0.01


def test_requests_wait_behind_the_tokens_the_front_end_streams():
    # One long request arrives first and decodes; a second arrives while
    # its tokens stream. With streaming work on the front end the second
    # reaches the engine later, the more the longer each token takes, and
    # the replay stops at a fixed point: its arrivals are what its tokens
    # give.
    trace = [
        TraceRequest(arrival_s=0.0, prompt_tokens=40, output_tokens=200, id="long"),
        TraceRequest(arrival_s=0.1, prompt_tokens=40, output_tokens=2, id="late"),
    ]
    cost = LinearCost(1e-3, 1e-5, 2e-4, 0.0)
    link = LinkModel.flat(10.0, 10.0, full_duplex=True)

    def run(stream_s: float) -> tuple[ReplayResult, int, float]:
        config = EngineConfig(
            gpu_kv_blocks=64,
            cpu_kv_blocks=0,
            block_bytes=1,
            admission_s_per_request=0.001,
            stream_s_per_token=stream_s,
        )
        return run_through_front_end(
            config,
            trace,
            lambda admitted_s: Engine(config, Fcfs(), cost, link, trace, admitted_s=admitted_s),
        )

    alone, passes, change_s = run(0.0)
    assert passes == 1 and change_s == 0.0
    slow, passes, change_s = run(0.002)
    assert passes > 1 and change_s <= 1e-6
    ttft = [r.token_times_s[0] - r.arrival_s for r in (alone.requests[1], slow.requests[1])]
    # The long request streams a token per iteration (about 1.2 ms) at 2 ms
    # each: by 0.1 the front end is far behind.
    assert ttft[1] > ttft[0] + 0.05
    assert slow.requests[0].token_times_s[0] == alone.requests[0].token_times_s[0]
    tokens = [t for r in slow.requests for t in r.token_times_s]
    exits = front_end_passage_s([0.0, 0.1], 0.001, tokens, 0.002)[1]
    # At the fixed point the late request reached the engine when its
    # tokens say it left the front end: its first token within a few
    # iterations after that.
    assert exits[1] < slow.requests[1].token_times_s[0] < exits[1] + 0.01


def test_the_per_sequence_cost_is_charged_once_per_prefilling_sequence():
    # Three prompts prefill together in the first iteration, then decode:
    # only that iteration pays, 3 x 10 ms; a fourth arrives later and its
    # prefill iteration pays 10 ms more.
    trace = [
        TraceRequest(arrival_s=0.0, prompt_tokens=40, output_tokens=4, id=str(i)) for i in range(3)
    ] + [TraceRequest(arrival_s=1.0, prompt_tokens=40, output_tokens=2, id="late")]
    cost = LinearCost(1e-3, 1e-5, 2e-4, 0.0)
    link = LinkModel.flat(10.0, 10.0, full_duplex=True)

    def run(per_sequence_s: float):
        config = EngineConfig(
            gpu_kv_blocks=64, cpu_kv_blocks=0, block_bytes=1, prefill_s_per_sequence=per_sequence_s
        )
        return Engine(config, Fcfs(), cost, link, trace).run()

    plain, charged = run(0.0), run(0.01)
    for a, b in zip(plain.requests[:3], charged.requests[:3], strict=True):
        assert b.token_times_s == pytest.approx([t + 0.03 for t in a.token_times_s])
    assert charged.requests[3].token_times_s == pytest.approx(
        [t + 0.01 for t in plain.requests[3].token_times_s]
    )
    assert [s.prefill_sequences for s in charged.timeline if s.prefill_sequences] == [3, 1]


@pytest.mark.parametrize(("policy", "b_preemptions"), [("fcfs", 1), ("fcfs-vllm", 0)])
def test_fcfs_vllm_admits_nothing_in_an_iteration_whose_decodes_need_the_blocks(
    policy: str, b_preemptions: int
) -> None:
    # 3 blocks of 4 tokens. a (1 block) decodes from the second iteration
    # on and grows into a second block then; b (8 tokens, 2 blocks) arrives
    # during the first. fcfs admits b into the 2 free blocks, and a's growth
    # takes one back by preempting b in the same iteration; fcfs-vllm leaves
    # b waiting (vLLM V1: running requests first, no admission in a step
    # that preempts). b starts once a is done (3 blocks at its last token)
    # either way: 0.074 + 10 ms + 8 prefill tokens.
    trace = [req(0.0, 4, 6, "a"), req(0.005, 8, 2, "b")]
    scheduler = make_scheduler(policy, rotation_inputs())
    result = Engine(config(gpu=3, cpu=0, bs=4), scheduler, AffineCost(), Link(), trace).run()
    a, b = result.requests
    assert a.token_times_s == pytest.approx([0.014, 0.026, 0.038, 0.05, 0.062, 0.074])
    assert a.preemptions == 0
    assert b.token_times_s == pytest.approx([0.092, 0.104])
    assert b.preemptions == b_preemptions
