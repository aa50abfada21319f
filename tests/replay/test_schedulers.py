"""The replay's scheduling policies: each plan on hand-made engine views, and
each policy's behaviour in the engine on small cases (fcfs recomputes,
waiting-first swaps out to admit, swapped-first resumes before admitting,
lvf calls the rotation policy and rotates the longest-running request out
and back in)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pytest

from planner.domain.requests import RequestState, Slo, Snapshot
from planner.domain.rotation import RotationInputs, RotationParams, RotationPlan, RotationVariant
from planner.policies.rotation import plan_rotation
from planner.replay.engine import Engine, EngineConfig
from planner.replay.records import ReplayResult
from planner.replay.scheduler_by_name import POLICY_NAMES, make_scheduler
from planner.replay.schedulers import (
    EngineView,
    Fcfs,
    Lvf,
    LvfAsVllmAdapter,
    SchedulePlan,
    Scheduler,
    SwappedFirst,
    WaitingFirst,
)
from planner.replay.state import IntArray, Phase, RequestColumns, blocks_needed
from planner.trace.records import TraceRequest

BLOCK_BYTES = 1000


class AffineCost:
    """10 ms per iteration + 1 ms per prefill token + 2 ms per decode token."""

    def iteration_time_s(
        self, prefill_tokens: int, decode_tokens: int, attended_context_tokens: int
    ) -> float:
        return 0.01 + 0.001 * prefill_tokens + 0.002 * decode_tokens


class Link:
    """1 MB/s shared by both directions."""

    def transfer_time_s(self, d2h_bytes: int, h2d_bytes: int, segment_bytes: int) -> float:
        return (d2h_bytes + h2d_bytes) / 1e6


def req(arrival_s: float, prompt: int, output: int, id: str) -> TraceRequest:
    return TraceRequest(arrival_s=arrival_s, prompt_tokens=prompt, output_tokens=output, id=id)


def config(gpu: int, cpu: int = 40, *, bs: int = 4, budget: int = 64) -> EngineConfig:
    return EngineConfig(
        gpu_kv_blocks=gpu,
        cpu_kv_blocks=cpu,
        block_bytes=BLOCK_BYTES,
        block_size_tokens=bs,
        max_batched_tokens=budget,
    )


def lvf_inputs(budget_blocks: int = 4) -> RotationInputs:
    return RotationInputs(
        params=RotationParams(alpha=3.0, beta_ttft=0.0, transfer_budget_blocks=budget_blocks)
    )


class RecordingEngine(Engine):
    """Logs (iteration, event, id) for every swap out/in and recompute, the
    (blocks held, blocks with a CPU copy) of each swap-out, and each
    request's phase after every iteration."""

    def __init__(
        self,
        config: EngineConfig,
        scheduler: Scheduler,
        cost: AffineCost,
        link: Link,
        trace: Sequence[TraceRequest],
    ) -> None:
        super().__init__(config, scheduler, cost, link, trace)
        self.events: list[tuple[int, str, str]] = []
        self.swapped_out: list[tuple[str, int, int]] = []
        self.phases: list[dict[str, Phase]] = []
        r = self.requests
        preempt, swap_in = self.state.preempt, self.state.swap_in

        def recording_preempt(rows: Sequence[int], swap: bool) -> int:
            held = [
                (row, int(r.gpu_blocks[row]), int(r.synced_blocks[row]))
                for row in rows
                if r.phase[row] == Phase.RUNNING
            ]
            copied = preempt(rows, swap)
            for row, gpu, synced in held:
                if r.phase[row] == Phase.ROTARY:
                    self.events.append((self._iterations, "swap_out", r.ids[row]))
                    self.swapped_out.append((r.ids[row], gpu, synced))
                else:
                    self.events.append((self._iterations, "recompute", r.ids[row]))
            return copied

        def recording_swap_in(rows: Sequence[int], needs: Sequence[int], keep: bool) -> int:
            self.events.extend((self._iterations, "swap_in", r.ids[row]) for row in rows)
            return swap_in(rows, needs, keep)

        self.state.preempt = recording_preempt  # type: ignore[method-assign]
        self.state.swap_in = recording_swap_in  # type: ignore[method-assign]

    def _copying_stretch(self, progress: Callable[[float], None] | None) -> bool:
        # Every lvf iteration through _iteration, so that phases has one entry
        # per iteration (the results are the same either way).
        return False

    def _iteration(self) -> None:
        super()._iteration()
        r = self.requests
        self.phases.append({id: Phase(p) for id, p in zip(r.ids, r.phase.tolist(), strict=True)})

    def first(self, event: str, id: str) -> int:
        """Iteration (0-based) of the first `event` of `id`."""
        return next(i for i, e, rid in self.events if e == event and rid == id)

    def first_phase(self, id: str, phase: Phase) -> int:
        return next(i for i, p in enumerate(self.phases) if p[id] == phase)


def simulate(
    trace: Sequence[TraceRequest],
    cfg: EngineConfig,
    policy: str,
    inputs: RotationInputs,
    on_snapshots: Callable[[Snapshot, RotationInputs], RotationPlan] | None = None,
) -> tuple[RecordingEngine, ReplayResult]:
    scheduler = make_scheduler(policy, inputs)
    if on_snapshots is not None:
        assert isinstance(scheduler, Lvf)
        scheduler = dataclasses.replace(scheduler, on_snapshots=on_snapshots)
    engine = RecordingEngine(cfg, scheduler, AffineCost(), Link(), trace)
    return engine, engine.run()


def check_all_finished(result: ReplayResult, trace: Sequence[TraceRequest]) -> None:
    for t, o in zip(trace, result.requests, strict=True):
        assert len(o.token_times_s) == t.output_tokens, o.id
        assert o.finish_s == o.token_times_s[-1]
        assert o.token_times_s == sorted(o.token_times_s)
        assert o.token_times_s[0] > t.arrival_s


# -- plans on hand-made views ----------------------------------------------------


@dataclass(frozen=True)
class Sim:
    """A request in a hand-made engine state."""

    id: str
    prompt: int
    phase: Phase
    kv: int = 0
    gpu: int = 0
    cpu: int = 0
    arrival: float = 0.0
    run_start: float = 0.0


def columns(*sims: Sim) -> RequestColumns:
    """The engine's columns for sims (row i is sims[i]), as the engine keeps
    them, start_blocks included."""
    trace = [TraceRequest(s.arrival, s.prompt, 10, id=s.id) for s in sims]
    r = RequestColumns.from_trace(trace, Slo())
    r.phase[:] = [s.phase for s in sims]
    r.kv_tokens[:] = [s.kv for s in sims]
    r.gpu_blocks[:] = [s.gpu for s in sims]
    r.cpu_blocks[:] = [s.cpu for s in sims]
    r.run_start_s[:] = [s.run_start for s in sims]
    r.start_blocks[:] = blocks_needed(r, np.arange(len(sims)), 4)
    return r


def view(
    requests: RequestColumns,
    *,
    free_gpu: int,
    free_cpu: int = 100,
    now_s: float = 1.0,
) -> EngineView:
    """The view of requests, each listed by its phase, in row order."""

    def rows(phase: Phase) -> IntArray:
        return np.flatnonzero(requests.phase == phase)

    return EngineView(
        now_s=now_s,
        requests=requests,
        queued=rows(Phase.QUEUED),
        running=rows(Phase.RUNNING),
        rotary=rows(Phase.ROTARY),
        free_gpu_blocks=free_gpu,
        free_cpu_blocks=free_cpu,
        block_size_tokens=4,
        last_iteration_s=0.02,
    )


def ids(requests: RequestColumns, rows: IntArray) -> list[str]:
    return [requests.ids[row] for row in rows.tolist()]


def test_blocks_needed() -> None:
    r = columns(
        Sim("q", 9, Phase.QUEUED),
        Sim("q", 1, Phase.QUEUED),
        Sim("r", 20, Phase.ROTARY, kv=5),
        Sim("r", 8, Phase.ROTARY, kv=9),
        Sim("r", 8, Phase.ROTARY, kv=8),
        Sim("r", 8, Phase.ROTARY, kv=7),
    )
    # Queued: the whole prompt. Swapped out mid-prefill: the whole prompt's
    # blocks again. Decoding: the blocks its KV fills, with room for the next
    # token.
    assert blocks_needed(r, np.arange(6), 4).tolist() == [3, 1, 5, 3, 3, 2]


def test_make_scheduler_names_and_flags() -> None:
    made = {name: make_scheduler(name, RotationInputs()) for name in POLICY_NAMES}
    assert {name: s.name for name, s in made.items()} == {n: n for n in POLICY_NAMES}
    assert {name: (s.swaps, s.keeps_cpu_copies) for name, s in made.items()} == {
        "fcfs": (False, False),
        "fcfs-vllm": (False, False),
        "lvf": (True, True),
        "lvf-paper": (True, True),
        "lvf-vllm": (False, False),
        "lvf-vllm-swap": (True, False),
        "waiting-first": (True, False),
        "swapped-first": (True, False),
        "cfs": (True, False),
        "cfs-peer": (True, False),
    }
    assert [name for name, s in made.items() if s.running_first] == [
        "fcfs-vllm",
        "lvf-vllm",
        "lvf-vllm-swap",
    ]
    with pytest.raises(ValueError, match="unknown policy 'sjf'"):
        make_scheduler("sjf", RotationInputs())


def test_fcfs_plan_admits_in_queue_order_and_never_preempts() -> None:
    r = columns(
        Sim("q1", 40, Phase.QUEUED),
        Sim("q2", 4, Phase.QUEUED),
        Sim("a", 8, Phase.RUNNING, kv=8, gpu=2),
    )
    plan = Fcfs().plan(view(r, free_gpu=1))
    assert ids(r, plan.start) == ["q1", "q2"]
    assert len(plan.swap_out) == len(plan.recompute) == plan.eager_blocks == 0


def test_waiting_first_plan_swaps_out_the_most_recent_to_admit() -> None:
    r = columns(
        Sim("old", 8, Phase.RUNNING, kv=8, gpu=2),
        Sim("new", 8, Phase.RUNNING, kv=8, gpu=2),
        Sim("w", 12, Phase.QUEUED),  # 3 blocks
        Sim("s", 4, Phase.ROTARY, kv=4, cpu=1),
    )
    plan = WaitingFirst().plan(view(r, free_gpu=1))
    assert ids(r, plan.swap_out) == ["new"]
    # Everyone queued was started, so the swapped request may resume after.
    assert ids(r, plan.start) == ["w", "s"]


def test_waiting_first_plan_keeps_swapped_waiting_behind_the_queue() -> None:
    r = columns(
        Sim("a", 16, Phase.RUNNING, kv=16, gpu=4),
        Sim("big", 40, Phase.QUEUED),  # 10 blocks: cannot be made room for
        Sim("s", 4, Phase.ROTARY, kv=4, cpu=1),
    )
    plan = WaitingFirst().plan(view(r, free_gpu=2))
    # Neither the big one nor, behind it, the swapped one starts; and the
    # running one is not swapped out for nothing.
    assert len(plan.start) == len(plan.swap_out) == 0


def test_waiting_first_plan_skips_a_victim_the_cpu_pool_cannot_take() -> None:
    r = columns(
        Sim("old", 4, Phase.RUNNING, kv=4, gpu=1),
        Sim("new", 16, Phase.RUNNING, kv=16, gpu=4),
        Sim("w", 4, Phase.QUEUED),
    )
    plan = WaitingFirst().plan(view(r, free_gpu=0, free_cpu=2))
    assert ids(r, plan.swap_out) == ["old"]
    assert ids(r, plan.start) == ["w"]


def test_waiting_first_plan_walks_the_victims_once_across_the_queue() -> None:
    # Victims from the most recent: c, z, b, a; 3 free CPU blocks. w1 (1
    # block) takes c (2 blocks); w2 (2 blocks, 1 free) passes over z (4 > 1
    # CPU block left) and takes b; w3 finds only a, which the full CPU pool
    # cannot take: it waits, and w4 behind it.
    r = columns(
        Sim("a", 4, Phase.RUNNING, kv=4, gpu=1),
        Sim("b", 4, Phase.RUNNING, kv=4, gpu=1),
        Sim("z", 8, Phase.RUNNING, kv=8, gpu=4),
        Sim("c", 8, Phase.RUNNING, kv=8, gpu=2),
        Sim("w1", 4, Phase.QUEUED),
        Sim("w2", 8, Phase.QUEUED),
        Sim("w3", 4, Phase.QUEUED),
        Sim("w4", 4, Phase.QUEUED),
    )
    plan = WaitingFirst().plan(view(r, free_gpu=0, free_cpu=3))
    assert ids(r, plan.swap_out) == ["c", "b"]
    assert ids(r, plan.start) == ["w1", "w2"]


def test_swapped_first_plan_resumes_first_and_admits_only_when_all_fit() -> None:
    sims = (
        Sim("s1", 8, Phase.ROTARY, kv=9, cpu=3),  # 3 blocks to resume
        Sim("s2", 4, Phase.ROTARY, kv=5, cpu=2),  # 2
        Sim("q", 4, Phase.QUEUED),
    )
    r = columns(*sims)
    assert ids(r, SwappedFirst().plan(view(r, free_gpu=5)).start) == ["s1", "s2", "q"]
    plan = SwappedFirst().plan(view(r, free_gpu=4))
    assert ids(r, plan.start) == ["s1", "s2"]  # q waits even though it would fit
    assert len(plan.swap_out) == len(plan.recompute) == 0
    only_queued = columns(sims[2])
    assert ids(only_queued, SwappedFirst().plan(view(only_queued, free_gpu=0)).start) == ["q"]


def test_lvf_plan_admits_everyone_fcfs_without_contention() -> None:
    r = columns(Sim("a", 8, Phase.QUEUED, arrival=0.5), Sim("b", 8, Phase.QUEUED, arrival=0.2))
    plan = Lvf(lvf_inputs()).plan(view(r, free_gpu=10))
    assert ids(r, plan.start) == ["b", "a"] and len(plan.swap_out) == 0


def test_lvf_plan_preempts_the_longest_running_for_a_lagging_waiter() -> None:
    r = columns(
        Sim("oldest", 8, Phase.RUNNING, kv=8, gpu=2, run_start=0.1),
        Sim("newer", 8, Phase.RUNNING, kv=8, gpu=2, run_start=0.9),
        Sim("w", 8, Phase.QUEUED, arrival=0.5),  # 2 blocks + 1
    )
    # Algorithm 1: neither running request sent its slack, which the bounded
    # LVF would need to preempt it.
    paper = lvf_inputs()
    paper = dataclasses.replace(
        paper, params=dataclasses.replace(paper.params, variant=RotationVariant.LVF_PAPER)
    )
    plan = Lvf(paper).plan(view(r, free_gpu=1))
    assert ids(r, plan.swap_out) == ["oldest"]
    assert ids(r, plan.start) == ["w"]


def _paper(inputs: RotationInputs) -> RotationInputs:
    return dataclasses.replace(
        inputs, params=dataclasses.replace(inputs.params, variant=RotationVariant.LVF_PAPER)
    )


def test_lvf_vllm_without_a_possible_victim_is_vllms_own_order() -> None:
    r = columns(
        Sim("run", 8, Phase.RUNNING, kv=8, gpu=2, run_start=0.1),
        Sim("late", 8, Phase.QUEUED, arrival=0.5),
        Sim("early", 8, Phase.QUEUED, arrival=0.2),
        Sim("swapped", 8, Phase.ROTARY, kv=9),
    )
    # "run" has no token yet: no slack, never a victim; the policy is not asked.
    adapter = LvfAsVllmAdapter(lvf_inputs())
    plan = adapter.plan(view(r, free_gpu=1))
    assert ids(r, plan.start) == ["swapped", "late", "early"] and len(plan.swap_out) == 0
    assert adapter.asked == 0
    # Its TPOT SLO lost by far more than lost_slack_tbts: a victim, so it asks.
    r.generated[0], r.first_token_s[0] = 2, 0.0
    adapter.plan(view(r, free_gpu=1, now_s=10.0))
    assert adapter.asked == 1


def test_lvf_vllm_applies_a_plan_only_when_it_preempts() -> None:
    r = columns(
        Sim("oldest", 8, Phase.RUNNING, kv=8, gpu=2, run_start=0.1),
        Sim("newer", 8, Phase.RUNNING, kv=8, gpu=2, run_start=0.9),
        Sim("w", 8, Phase.QUEUED, arrival=0.5),
        Sim("v", 8, Phase.QUEUED, arrival=0.6),
    )
    adapter = LvfAsVllmAdapter(_paper(lvf_inputs()))
    plan = adapter.plan(view(r, free_gpu=1))
    lvf = Lvf(_paper(lvf_inputs())).plan(view(r, free_gpu=1))
    assert ids(r, plan.swap_out) == ids(r, lvf.swap_out) == ["oldest"]
    # The plan's prioritized first, then the rest in vLLM's order.
    assert ids(r, plan.start)[: len(lvf.start)] == ids(r, lvf.start)
    assert sorted(ids(r, plan.start)) == ["v", "w"]
    assert (adapter.asked, adapter.applied) == (1, 1)
    # No contention: lvf orders the queue by arrival, the adapter keeps vLLM's.
    r = columns(Sim("a", 8, Phase.QUEUED, arrival=0.5), Sim("b", 8, Phase.QUEUED, arrival=0.2))
    adapter = LvfAsVllmAdapter(_paper(lvf_inputs()))
    assert ids(r, Lvf(_paper(lvf_inputs())).plan(view(r, free_gpu=10)).start) == ["b", "a"]
    plan = adapter.plan(view(r, free_gpu=10))
    assert ids(r, plan.start) == ["a", "b"] and len(plan.swap_out) == 0
    assert (adapter.asked, adapter.applied) == (1, 0)


def test_lvf_plan_maps_decisions_back_when_ids_repeat() -> None:
    # Two requests share an id (a trace id "r1" and the name given to an
    # unnamed second request): decisions still name a row each.
    trace = [req(0.0, 8, 4, "r1"), TraceRequest(0.1, 8, 4)]
    r = RequestColumns.from_trace(trace, Slo())
    assert r.ids == ["r1", "r1"] and r.row_of is None
    r.phase[:] = Phase.QUEUED
    r.start_blocks[:] = blocks_needed(r, np.arange(2), 4)
    plan = Lvf(lvf_inputs()).plan(view(r, free_gpu=10))
    assert len(plan.start) == 2 and set(plan.start.tolist()) <= {0, 1}


def _random_trace(seed: int, n: int = 40) -> list[TraceRequest]:
    rng = np.random.default_rng(seed)
    arrivals = np.round(np.cumsum(rng.exponential(0.02, n)), 3)
    return [
        req(float(a), int(rng.integers(1, 40)), int(rng.integers(1, 30)), f"q{i}")
        for i, a in enumerate(arrivals)
    ]


@pytest.mark.parametrize("policy", ["lvf", "lvf-paper"])
@pytest.mark.parametrize(("seed", "gpu", "cpu"), [(1, 10, 12), (2, 12, 3), (3, 8, 40), (4, 40, 40)])
def test_lvf_on_columns_runs_as_lvf_on_snapshots(
    seed: int, gpu: int, cpu: int, policy: str
) -> None:
    # Lvf hands the policy its columns directly; on snapshots through
    # plan_rotation (on_snapshots), a run gives exactly the same, decision
    # by decision.
    trace = _random_trace(seed)
    cfg = config(gpu=gpu, cpu=cpu)
    _, by_columns = simulate(trace, cfg, policy, lvf_inputs())
    calls = []

    def substituted(snapshot: Snapshot, inputs: RotationInputs) -> RotationPlan:
        calls.append(snapshot.now_s)
        return plan_rotation(snapshot, inputs)

    _, by_snapshots = simulate(trace, cfg, policy, lvf_inputs(), on_snapshots=substituted)
    assert len(calls) == by_snapshots.totals.iterations
    assert by_columns.requests == by_snapshots.requests
    assert by_columns.timeline == by_snapshots.timeline
    assert by_columns.totals.preemptions > 0 or gpu == 40


# -- behaviour in the engine -------------------------------------------------------


def test_fcfs_preempts_the_most_recent_by_recompute() -> None:
    # Blocks of 4 tokens, pool of 3. A and B (4-token prompts, 1 block each)
    # both start; at the first decode both need a second block and one is
    # free: A takes it, B (admitted last) is preempted by recompute and
    # re-queued to prefill its prompt plus its first token once A has finished.
    trace = [req(0.0, 4, 8, "A"), req(0.0, 4, 8, "B")]
    engine, result = simulate(trace, config(gpu=3), "fcfs", RotationInputs())
    a, b = result.requests
    assert engine.events == [(1, "recompute", "B")]
    assert a.token_times_s == pytest.approx([0.018 + 0.012 * k for k in range(8)], abs=1e-12)
    # B: first token with A's; after A's last (102 ms) a 5-token prefill
    # (15 ms) gives its second, then 12 ms decodes.
    assert b.token_times_s == pytest.approx(
        [0.018, 0.117, 0.129, 0.141, 0.153, 0.165, 0.177, 0.189], abs=1e-12
    )
    assert (a.preemptions, b.preemptions) == (0, 1)
    assert (a.recomputed_tokens, b.recomputed_tokens) == (0, 4)
    totals = result.totals
    assert totals.preemptions == 1 and totals.swap_outs == totals.swap_ins == 0
    assert totals.bytes_d2h == totals.bytes_h2d == 0
    assert [s.prefill_tokens for s in result.timeline if s.prefill_tokens] == [8, 5]


def test_lvf_vllm_with_no_victim_preempts_as_vllm_does() -> None:
    # fcfs's case: nobody could be a victim (no TPOT slack to spare yet), so
    # every step is vLLM's own; B, admitted last, is preempted when the
    # decodes need a block and recomputed, exactly as fcfs-vllm does it.
    trace = [req(0.0, 4, 8, "A"), req(0.0, 4, 8, "B")]
    engine, result = simulate(trace, config(gpu=3), "lvf-vllm", lvf_inputs())
    _, vllm = simulate(trace, config(gpu=3), "fcfs-vllm", lvf_inputs())
    assert result.totals.preemptions == 1 and result.totals.swap_outs == 0
    assert result.requests[1].recomputed_tokens > 0
    assert [o.token_times_s for o in result.requests] == [o.token_times_s for o in vllm.requests]
    assert isinstance(engine.scheduler, LvfAsVllmAdapter) and engine.scheduler.asked == 0
    check_all_finished(result, trace)


def test_lvf_vllm_swap_swaps_vllms_own_preemptions() -> None:
    # The same case with engine_preemptions "swap": B is swapped out (the
    # adapter's connector) instead of recomputed, and swapped back in once A
    # has finished.
    trace = [req(0.0, 4, 8, "A"), req(0.0, 4, 8, "B")]
    engine, result = simulate(trace, config(gpu=3), "lvf-vllm-swap", lvf_inputs())
    assert [e for e in engine.events if e[2] == "B"][:1] == [(1, "swap_out", "B")]
    assert {e for _, e, _ in engine.events} == {"swap_out", "swap_in"}
    assert result.totals.preemptions == result.totals.swap_outs == 1
    assert result.requests[1].recomputed_tokens == 0
    assert isinstance(engine.scheduler, LvfAsVllmAdapter) and engine.scheduler.asked == 0
    check_all_finished(result, trace)


def test_waiting_first_swaps_out_to_admit_a_waiting_request() -> None:
    # A (12-token prompt, 3 of 4 blocks) runs; B (2 blocks) arrives and does
    # not fit: waiting-first swaps A out and admits B in the same iteration,
    # resumes A only once B is done.
    trace = [req(0.0, 12, 4, "A"), req(0.001, 8, 2, "B")]
    engine, result = simulate(trace, config(gpu=4), "waiting-first", RotationInputs())
    a, b = result.requests
    assert engine.events == [(1, "swap_out", "A"), (3, "swap_in", "A")]
    assert engine.phases[1] == {"A": Phase.ROTARY, "B": Phase.RUNNING}
    assert b.finish_s is not None and b.finish_s < a.token_times_s[1]
    assert (a.swap_outs, a.swap_ins, a.recomputed_tokens, b.preemptions) == (1, 1, 0, 0)
    check_all_finished(result, trace)


# Two short requests; B swaps out (it needs a block when none is free) just
# before C arrives; C would fit in the pool on its own right away.
SWAP_THEN_ARRIVE = [
    req(0.0, 4, 6, "A"),
    req(0.0, 8, 6, "B"),
    req(0.025, 4, 2, "C"),
]


def test_swapped_first_resumes_swapped_before_admitting() -> None:
    engine, result = simulate(SWAP_THEN_ARRIVE, config(gpu=4), "swapped-first", RotationInputs())
    # B (admitted last) swaps itself out at the first decode. C arrives; it
    # would fit in the 2 free blocks, but B (3 blocks to resume) is first in
    # line: C waits until A finishes and B is resumed, in the same iteration.
    assert engine.events[0] == (1, "swap_out", "B")
    assert result.timeline[2].gpu_kv_blocks_used == 2
    assert [p["C"] for p in engine.phases[2:6]] == [Phase.QUEUED] * 4
    assert engine.first("swap_in", "B") == 6
    assert engine.first_phase("C", Phase.RUNNING) == 6
    check_all_finished(result, SWAP_THEN_ARRIVE)


def test_waiting_first_admits_before_resuming_on_the_same_case() -> None:
    engine, result = simulate(SWAP_THEN_ARRIVE, config(gpu=4), "waiting-first", RotationInputs())
    assert engine.events[0] == (1, "swap_out", "B")
    assert engine.phases[2]["C"] == Phase.RUNNING
    assert engine.first("swap_in", "B") == 6
    c = result.requests[2]
    assert c.finish_s is not None and c.finish_s < result.requests[1].token_times_s[1]
    check_all_finished(result, SWAP_THEN_ARRIVE)


# A and C run (A since 0, C from its arrival); B arrives later needing more
# than is free. Blocks of 4 tokens, pool of 10.
ROTATION_CASE = [
    req(0.0, 8, 12, "A"),
    req(0.001, 8, 12, "C"),
    req(0.05, 20, 2, "B"),
]


def test_lvf_paper_rotates_the_longest_running_out_and_back_in() -> None:
    decisions: list[tuple[Snapshot, RotationPlan]] = []

    def spy(snapshot: Snapshot, inputs: RotationInputs) -> RotationPlan:
        plan = plan_rotation(snapshot, inputs)
        decisions.append((snapshot, plan))
        return plan

    engine, result = simulate(
        ROTATION_CASE, config(gpu=10), "lvf-paper", lvf_inputs(), on_snapshots=spy
    )
    # The policy decides every iteration.
    assert len(decisions) == result.totals.iterations
    # The first contended decision: B (5 prompt blocks + 1 for its first
    # decode) lags and does not fit in the 4 free blocks; A has run longest,
    # so it is the one preempted (waiting-first would take C, admitted last).
    k, (snapshot, plan) = next((i, d) for i, d in enumerate(decisions) if not d[1].fcfs_fallback)
    table = snapshot.requests
    states = dict(zip(table.ids, table.state.tolist(), strict=True))
    assert states == {
        "A": RequestState.RUNNING,
        "C": RequestState.RUNNING,
        "B": RequestState.WAITING,
    }
    assert snapshot.free_gpu_blocks == 4
    assert [d.id for d in plan.preempted] == ["A"]
    assert [d.id for d in plan.prioritized] == ["B"]
    # The engine carried it out: A swapped out and B admitted in that
    # iteration; A rotary, later swapped back in, and everyone finished.
    assert engine.first("swap_out", "A") == k
    assert engine.phases[k]["A"] == Phase.ROTARY and engine.phases[k]["B"] == Phase.RUNNING
    assert engine.first("swap_in", "A") > k
    a, _, b = result.requests
    assert a.swap_outs >= 1 and a.swap_ins >= 1
    assert b.token_times_s[0] < a.finish_s  # type: ignore[operator]
    check_all_finished(result, ROTATION_CASE)
    # DuplexKV eager copies: A's full blocks had CPU copies before it was
    # preempted (3 blocks held, 2 full ones already copied), so only its
    # last block was copied out then.
    assert engine.swapped_out[0] == ("A", 3, 2)


def test_waiting_first_preempts_the_most_recent_on_the_rotation_case() -> None:
    engine, result = simulate(ROTATION_CASE, config(gpu=10), "waiting-first", RotationInputs())
    assert engine.events[0][1:] == ("swap_out", "C")
    check_all_finished(result, ROTATION_CASE)


def test_lvf_copies_full_blocks_eagerly_without_contention() -> None:
    # A alone: nothing contends, yet its full blocks are copied to the CPU
    # within the transfer budget (DuplexKV eager copies), and released when
    # it finishes.
    engine, result = simulate([req(0.0, 16, 10, "A")], config(gpu=10), "lvf", lvf_inputs())
    check_all_finished(result, [req(0.0, 16, 10, "A")])
    assert result.totals.swap_outs == 0
    # 16 + 9 = 25 tokens: 6 full blocks by the end, each copied once.
    assert result.totals.bytes_d2h == 6 * BLOCK_BYTES
    assert max(s.cpu_kv_blocks_used for s in result.timeline) > 0
    assert engine.state.free_cpu == 40


class AskingFcfs(Fcfs):
    """fcfs that says it asked a planning policy for every plan."""

    def plan(self, view: EngineView) -> SchedulePlan:
        return SchedulePlan(start=view.queued, asked_policy=True)


@pytest.mark.parametrize(("scheduler", "charged"), [(AskingFcfs(), True), (Fcfs(), False)])
def test_an_iteration_whose_scheduler_asked_its_policy_takes_the_planning_time(
    scheduler: Scheduler, charged: bool
) -> None:
    # A and B start together in the first iteration (8 prompt tokens: 18 ms);
    # nobody waits afterwards, so the scheduler is asked only then: with 5 ms
    # per call that iteration alone takes 5 ms more (decodes: 14 ms).
    trace = [req(0.0, 4, 3, "A"), req(0.0, 4, 3, "B")]
    cfg = dataclasses.replace(config(gpu=10), planning_s_per_call=0.005)
    result = Engine(cfg, scheduler, AffineCost(), Link(), trace).run()
    first = 0.018 + (0.005 if charged else 0.0)
    for o in result.requests:
        assert o.token_times_s == pytest.approx([first, first + 0.014, first + 0.028], abs=1e-12)


def test_lvf_vllm_says_when_it_asked_its_policy() -> None:
    r = columns(
        Sim("run", 8, Phase.RUNNING, kv=8, gpu=2, run_start=0.1),
        Sim("w", 8, Phase.QUEUED, arrival=0.5),
    )
    adapter = LvfAsVllmAdapter(lvf_inputs())
    # No victim: not asked.
    assert not adapter.plan(view(r, free_gpu=1)).asked_policy
    r.generated[0], r.first_token_s[0] = 2, 0.0
    assert adapter.plan(view(r, free_gpu=1, now_s=10.0)).asked_policy
    assert adapter.asked == 1
