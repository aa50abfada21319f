"""The long-context offload topology (planner.replay.longctx_engine): hand-
checked tiny runs with a stub cost model, every request finishing exactly
once, the GPU budget, determinism, and each baseline's placements."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from planner.domain.offload import OffloadParams
from planner.domain.requests import Slo
from planner.replay.longctx_engine import LongctxConfig, LongctxEngine, LongctxRun
from planner.replay.longctx_policies import (
    DeepSpeed,
    FlexGen,
    FlexGenPlus,
    Greedy,
    OffloadSetup,
    StepView,
    double_buffered_step_s,
)
from planner.replay.longctx_registry import LONGCTX_POLICY_NAMES, make_longctx_policy
from planner.trace.arrivals import RateSchedule
from planner.trace.generate import GenConfig, generate
from planner.trace.length_model import build_length_model
from planner.trace.records import TraceRequest

LAYERS = 4
BW = 1000.0  # layer blocks per second: a 5-block layer fetch takes 5 ms


class StubCost:
    """Prefill: 1 s per iteration. Decode: 1 ms per layer for any batch."""

    def iteration_time_s(
        self,
        prefill_tokens: int,
        decode_tokens: int,
        attended_context_tokens: int,
        prefill_attention_pairs: int = 0,
    ) -> float:
        if prefill_tokens:
            return 1.0
        return 1e-3 * LAYERS if decode_tokens else 0.0


def config(budget: int = 10_000, *, slo_tbt: float = 0.1, max_running: int = 8) -> LongctxConfig:
    return LongctxConfig(
        num_layers=LAYERS,
        gpu_block_budget=budget,
        link_blocks_per_s=BW,
        layer_block_bytes=1024,
        block_size_tokens=16,
        max_running=max_running,
        slo=Slo(ttft_s=5.0, tbt_s=slo_tbt),
    )


def offload_setup(cfg: LongctxConfig, time_limit_s: float = 0.05) -> OffloadSetup:
    return OffloadSetup(
        num_layers=cfg.num_layers,
        block_size_tokens=cfg.block_size_tokens,
        gpu_block_budget=cfg.gpu_block_budget,
        link_blocks_per_s=cfg.link_blocks_per_s,
        max_running=cfg.max_running,
        params=OffloadParams(time_limit_s=time_limit_s),
    )


def run(
    name: str, trace: list[TraceRequest], cfg: LongctxConfig, *, design_tokens: int = 64
) -> LongctxRun:
    policy = make_longctx_policy(name, offload_setup(cfg), design_tokens=design_tokens)
    return LongctxEngine(cfg, policy, StubCost(), trace).run()


ONE = [TraceRequest(arrival_s=0.0, prompt_tokens=64, output_tokens=3, id="a")]


@pytest.mark.parametrize("name", ["greedy", "flexgen+", "flexgen"])
def test_one_request_nothing_offloaded_decodes_at_compute_speed(name: str) -> None:
    out = run(name, ONE, config()).result.requests[0]
    # Prefill 1 s gives the first token; each decode step is 4 layers x 1 ms.
    assert out.token_times_s == pytest.approx([1.0, 1.004, 1.008])
    assert out.finish_s == pytest.approx(1.008)


def test_deepspeed_fetches_every_layer_double_buffered() -> None:
    result = run("deepspeed", ONE, config())
    out = result.result.requests[0]
    # 65 then 66 KV tokens: 5 blocks a layer, 5 ms a fetch; fetches back to
    # back (4 x 5 ms) then the last layer's 1 ms of compute: 21 ms a step.
    assert out.token_times_s == pytest.approx([1.0, 1.021, 1.042])
    assert result.stats.fetched_blocks == 2 * LAYERS * 5
    assert result.result.totals.bytes_h2d == 2 * LAYERS * 5 * 1024


def test_double_buffered_step_worked_examples() -> None:
    comp = np.full(4, 1e-3)
    assert double_buffered_step_s(comp, 5, BW) == pytest.approx(0.021)
    # Fetch shorter than compute: one fetch exposed, then compute-bound.
    assert double_buffered_step_s(np.full(4, 10e-3), 5, BW) == pytest.approx(0.045)


@pytest.mark.parametrize("name", ["greedy", "flexgen+"])
def test_one_request_offloading_half_the_layers(name: str) -> None:
    # 5 blocks a layer at the end: all resident needs 20, one layer offloaded
    # 15 + 5 = 20, two (layers 2 and 4, 1-indexed) 10 + 5 = 15 <= 17.
    result = run(name, ONE, config(budget=17))
    out = result.result.requests[0]
    # Exact event model: layer 2's fetch (5 ms) from 0, layer 1 runs 0-1 ms,
    # layer 2 runs 5-6 ms, layer 4's fetch 6-11 ms, layer 3 6-7, layer 4
    # 11-12: 12 ms a step.
    assert out.token_times_s == pytest.approx([1.0, 1.012, 1.024])
    assert result.stats.peak_gpu_blocks <= 17
    assert result.stats.over_budget_steps == 0


def test_orbitflow_token_deposit_paces_the_output() -> None:
    trace = [TraceRequest(arrival_s=0.0, prompt_tokens=64, output_tokens=4, id="a")]
    result = run("orbitflow", trace, config(slo_tbt=0.01))
    out = result.result.requests[0]
    # Generated at 1.0 (first, shown at once), 1.004, 1.008 and 1.012; the
    # deposit releases one per 10 ms (1.01) and flushes the rest at finish.
    assert out.token_times_s == pytest.approx([1.0, 1.01, 1.012, 1.012])
    assert out.finish_s == pytest.approx(1.012)
    assert result.stats.replans >= 1
    assert result.stats.replan_reasons.get("no_plan") == 1


def test_requests_wait_for_memory_and_are_rejected_when_they_never_fit() -> None:
    trace = [
        TraceRequest(arrival_s=0.0, prompt_tokens=64, output_tokens=3, id="a"),
        TraceRequest(arrival_s=0.0, prompt_tokens=64, output_tokens=3, id="b"),
        TraceRequest(arrival_s=0.0, prompt_tokens=4000, output_tokens=3, id="huge"),
    ]
    # Greedy admits at its most offloading pattern (2 of 4 layers): 15 blocks
    # each at the final length; a budget of 17 holds one of a and b at a time.
    result = run("greedy", trace, config(budget=17))
    a, b, huge = result.result.requests
    assert result.stats.rejected == 1 and huge.finish_s is None and not huge.token_times_s
    assert a.finish_s is not None and b.finish_s is not None
    # b's prefill starts when a has finished.
    assert b.token_times_s[0] == pytest.approx(a.finish_s + 1.0)


def long_trace(n: int = 14, seed: int = 3) -> list[TraceRequest]:
    lengths = build_length_model(
        lengths=None,
        prompt_lengths="uniform:low=200,high=1500",
        output_lengths="uniform:low=2,high=40",
        max_prompt_tokens=None,
        max_output_tokens=None,
    )
    return generate(
        GenConfig(
            schedule=RateSchedule.constant(4.0),
            lengths=lengths,
            seed=seed,
            num_requests=n,
        )
    )


@pytest.mark.parametrize("name", LONGCTX_POLICY_NAMES)
def test_every_request_finishes_exactly_once_within_budget(name: str) -> None:
    trace = long_trace()
    cfg = config(budget=1200, slo_tbt=0.02, max_running=8)
    result = run(name, trace, cfg, design_tokens=900)
    stats = result.stats
    # The budget binds: every policy fetches KV over the link.
    assert stats.fetched_blocks > 0
    assert stats.over_budget_steps == 0
    assert stats.peak_gpu_blocks <= cfg.gpu_block_budget
    assert all(s.gpu_kv_blocks_used <= cfg.gpu_block_budget for s in result.result.timeline)
    done = [r for r in result.result.requests if r.finish_s is not None]
    assert len(done) + stats.rejected == len(trace)
    for r in done:
        # One visible token per output token, in time order, none after finish.
        assert len(r.token_times_s) == r.output_tokens
        assert r.token_times_s == sorted(r.token_times_s)
        assert r.token_times_s[-1] <= r.finish_s + 1e-12
        assert r.token_times_s[0] >= r.arrival_s
    assert all(s.running <= cfg.max_running for s in result.result.timeline)
    if name == "orbitflow":
        assert stats.replans >= 1


@pytest.mark.parametrize("name", ["deepspeed", "flexgen", "flexgen+", "greedy"])
def test_baselines_are_deterministic(name: str) -> None:
    trace = long_trace(10, seed=5)
    cfg = config(budget=1200, slo_tbt=0.02, max_running=8)
    first = run(name, trace, cfg, design_tokens=900)
    again = run(name, trace, cfg, design_tokens=900)
    assert [r.token_times_s for r in first.result.requests] == [
        r.token_times_s for r in again.result.requests
    ]
    assert replace(first.stats, plan_wall_s=0, run_wall_s=0, solver_time_share=0) == replace(
        again.stats, plan_wall_s=0, run_wall_s=0, solver_time_share=0
    )


def test_orbitflow_deterministic_when_every_solve_finishes() -> None:
    trace = [
        TraceRequest(arrival_s=0.0, prompt_tokens=300, output_tokens=6, id="a"),
        TraceRequest(arrival_s=0.0, prompt_tokens=500, output_tokens=4, id="b"),
    ]
    cfg = config(budget=150, slo_tbt=0.02)
    setup = offload_setup(cfg, time_limit_s=5.0)
    runs = [
        LongctxEngine(
            cfg, make_longctx_policy("orbitflow", setup, design_tokens=1), StubCost(), trace
        )
        .run()
        .result
        for _ in range(2)
    ]
    assert [r.token_times_s for r in runs[0].requests] == [
        r.token_times_s for r in runs[1].requests
    ]


def view(blocks: list[int], ids: tuple[str, ...] | None = None) -> StepView:
    b = np.array(blocks, dtype=np.int64)
    n = len(blocks)
    return StepView(
        step=0,
        ids=ids if ids is not None else tuple(f"r{i}" for i in range(n)),
        num_tokens=b * 16 - 1,
        blocks=b,
        deposited_tokens=np.zeros(n, dtype=np.int64),
        slo_tbt_s=np.full(n, 0.1),
        comp_s=np.full(LAYERS, 1e-3),
    )


def test_deepspeed_keeps_no_layer_between_steps() -> None:
    policy = DeepSpeed(offload_setup(config(budget=100)))
    d = policy.decide(view([5, 7]))
    assert d.rows.tolist() == [0, 1]
    assert not d.resident.any()  # every layer offloaded, all L fetched each step
    # Memory: the layer being computed and the one being fetched.
    assert policy.gpu_blocks(np.array([5, 7]), d.resident) == 24
    assert policy.fits(np.array([25, 25])) and not policy.fits(np.array([25, 26]))


def test_flexgen_is_static_and_flexgen_plus_replans_on_batch_change() -> None:
    cfg = config(budget=60)
    static = FlexGen(offload_setup(cfg), design_tokens=16 * 5)
    # Design: 8 requests of 5 blocks; only 2 of 4 layers offloaded fits
    # (8 x 5 x 2 kept + 40 buffer = 120 > 60, so the most offloading pattern).
    first = static.decide(view([3]))
    later = static.decide(view([3, 2, 1]))
    assert (first.resident[0] == later.resident[0]).all()
    assert first.resident[0].tolist() == [True, False, True, False]
    assert not first.replanned and not later.replanned and static.replans == 1

    plus = FlexGenPlus(offload_setup(cfg))
    d1 = plus.decide(view([2, 2]))
    d2 = plus.decide(view([2, 2]))
    d3 = plus.decide(view([2, 2, 2], ids=("r0", "r1", "r9")))
    assert d1.replanned and not d2.replanned and d3.replanned
    assert plus.replans == 2 and plus.reasons == {"no_plan": 1, "batch_change": 1}
    # Uniform: every row gets the same pattern.
    assert (d3.resident == d3.resident[0]).all()


def test_greedy_replans_every_step_with_per_request_patterns() -> None:
    policy = Greedy(offload_setup(config(budget=30)))
    d = policy.decide(view([1, 8]))
    assert d.replanned and policy.replans == 1
    # The big request offloads, the small one keeps everything.
    assert d.resident[0].all() and not d.resident[1].all()
    assert policy.gpu_blocks(np.array([1, 8]), d.resident) <= 30
    policy.decide(view([1, 8]))
    assert policy.replans == 2


def test_unknown_policy_name() -> None:
    with pytest.raises(ValueError, match="unknown long-context policy 'fcfs'"):
        make_longctx_policy("fcfs", offload_setup(config()), design_tokens=1)


def test_orbitflow_replans_on_profile_mismatch_under_noise() -> None:
    trace = long_trace(8, seed=2)
    cfg = replace(config(budget=1200, slo_tbt=0.02, max_running=8), jitter_cv=0.5, seed=1)
    result = run("orbitflow", trace, cfg)
    reasons = result.stats.replan_reasons
    assert reasons.get("profile_mismatch", 0) >= 1
    assert reasons.get("batch_change", 0) >= 1 and reasons.get("no_plan") == 1
    # Without noise the profile is exact: no mismatch.
    quiet = run("orbitflow", trace, replace(cfg, jitter_cv=0.0))
    assert "profile_mismatch" not in quiet.stats.replan_reasons
