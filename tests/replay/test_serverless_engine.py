"""The serverless topology's engine (planner.replay.serverless_engine) on
hand-checked tiny cases: one request's timing from the cost model, every
request finishing once, determinism, a dedicated switch's cold start =
weight bytes / the load link's bandwidth."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.domain.requests import Slo
from planner.policies.serverless import choose_kernel
from planner.profiles.c2c_cost import GemmTiles, model_pass_cost
from planner.profiles.mig import GB
from planner.replay.noise import JitterFactors
from planner.replay.serverless_engine import (
    AEGAEON,
    C2CSERVE,
    C2CSERVE_CHUNKED,
    C2CSERVE_EXCLUSIVE,
    C2CSERVE_INACTIVE,
    C2CSERVE_KV_CAP,
    C2CSERVE_KV_FIRST,
    C2CSERVE_LIGHT_SHARE,
    C2CSERVE_PARTIAL,
    C2CSERVE_STICKY_SHARE,
    C2CSERVE_STREAM,
    DEDICATED,
    RANDOM,
    SERVERLESS_POLICY_NAMES,
    SLLM,
    STATIC_CHUNK,
    ServerlessConfig,
    ServerlessEngine,
    ServerlessRun,
)
from planner.replay.serverless_link import SharedLink
from planner.replay.serverless_report import summarize_serverless
from planner.replay.serverless_setup import PCIE_GBPS, ServerlessKnobs, serverless_config
from planner.replay.setup import ReplayKnobs, build_setup
from planner.trace.records import TraceRequest


def config(**changes: object) -> ServerlessConfig:
    setup = build_setup(
        "llama-3-8b@h100-sxm-80gb",
        ReplayKnobs(slo=Slo(ttft_s=5.0, tbt_s=0.25), max_batched_tokens=512, max_running=16),
    )
    knobs = replace(ServerlessKnobs(), **changes)  # type: ignore[arg-type]
    return serverless_config(setup, knobs)


def trace(n: int, models: int, gap: float = 0.3) -> list[TraceRequest]:
    return [
        TraceRequest(
            arrival_s=gap * i,
            prompt_tokens=200 + 37 * (i % 5),
            output_tokens=5 + (i % 4),
            id=f"r{i}",
            model=f"m{i % models}",
        )
        for i in range(n)
    ]


def test_one_request_static_chunk_hand_checked() -> None:
    cfg = config()
    req = [TraceRequest(arrival_s=1.0, prompt_tokens=300, output_tokens=3, model="a")]
    run = ServerlessEngine(cfg, STATIC_CHUNK, req).run()
    mig = cfg.slices[0]
    ready = 1.0 + cfg.switch_setup_s
    k = choose_kernel(precision="bf16", tokens=300, mig=mig)
    # One chunk of 300 tokens (static chunk 512) alone on the link, rho 0.
    prefill = model_pass_cost(
        cfg.model,
        300,
        rho=0.0,
        mig=mig,
        c2c_gbps=cfg.link_gbps,
        attended_pairs=300 * 150.0,
        kv_read_tokens=0.0,
        tiles=GemmTiles(k.sym_block_m, k.block_n, k.asym_block_k),
    ).time_s
    out = run.result.requests[0]
    assert out.token_times_s[0] == pytest.approx(ready + prefill)
    assert len(out.token_times_s) == 3
    assert out.finish_s == out.token_times_s[-1]
    assert run.stats.switches == 1
    assert run.switches[0].latency_s == pytest.approx(cfg.switch_setup_s)
    # The C2C bytes moved fill the link for the busy time at most.
    assert 0 < run.stats.c2c_bytes <= cfg.link_gbps * GB * (out.finish_s - 1.0) + 1


def test_jitter_scales_each_iteration_by_the_seeded_factor_stream() -> None:
    """One request, one chunk: its first token comes after the switch plus
    the prefill's modelled time times the first factor of the run's seeded
    stream (planner.replay.noise, shared with the cluster topology); the
    second token's iteration takes the second factor."""
    req = [TraceRequest(arrival_s=1.0, prompt_tokens=300, output_tokens=3, model="a")]
    plain = ServerlessEngine(config(), STATIC_CHUNK, req).run().result.requests[0]
    cfg = config(jitter_cv=0.3, seed=7)
    noisy = ServerlessEngine(cfg, STATIC_CHUNK, req).run().result.requests[0]
    factors = JitterFactors(0.3, 7)
    ready = 1.0 + cfg.switch_setup_s
    first = factors.apply(1.0)
    second = factors.apply(1.0)
    assert first != pytest.approx(1.0, abs=1e-3)
    prefill = plain.token_times_s[0] - ready
    decode = plain.token_times_s[1] - plain.token_times_s[0]
    assert noisy.token_times_s[0] == pytest.approx(ready + prefill * first)
    assert noisy.token_times_s[1] - noisy.token_times_s[0] == pytest.approx(decode * second)


@pytest.mark.parametrize("policy", [C2CSERVE, DEDICATED])
def test_jitter_is_deterministic_for_a_seed_and_off_at_zero(policy: str) -> None:
    reqs = trace(24, 4)

    def times(**knobs: object) -> list[list[float]]:
        run = ServerlessEngine(config(**knobs), policy, reqs).run()
        return [o.token_times_s for o in run.result.requests]

    plain = times()
    assert times(jitter_cv=0.0, seed=5) == plain
    seeded = times(jitter_cv=0.2, seed=1)
    assert times(jitter_cv=0.2, seed=1) == seeded
    assert seeded != plain
    assert times(jitter_cv=0.2, seed=2) != seeded


W_8B = 16.06e9


@pytest.mark.parametrize(
    ("policy", "after_read_s", "warm_s"),
    [
        (C2CSERVE_STREAM, 0.05, 0.05),
        (DEDICATED, W_8B / (PCIE_GBPS * GB), W_8B / (PCIE_GBPS * GB)),
        # ServerlessLLM's copy runs alongside the read: only its engine work follows.
        (SLLM, 1.7 - W_8B / (405.0 * GB), 1.7),
        (AEGAEON, 0.119, 0.119),
    ],
)
def test_a_cold_model_is_read_from_disk_first(
    policy: str, after_read_s: float, warm_s: float
) -> None:
    cfg = config(disk_gbps=2.0)
    assert cfg.model.param_bytes == pytest.approx(W_8B, rel=1e-3)
    w = float(cfg.model.param_bytes)
    req = [TraceRequest(arrival_s=1.0, prompt_tokens=300, output_tokens=3, model="a")]
    run = ServerlessEngine(cfg, policy, req).run()
    (switch,) = run.switches
    assert switch.latency_s == pytest.approx(w / (2.0 * GB) + after_read_s, rel=1e-3)
    assert run.stats.disk_reads == 1
    warm = ServerlessEngine(config(), policy, req).run()
    assert warm.stats.disk_reads == 0
    assert warm.switches[0].latency_s == pytest.approx(warm_s, rel=1e-3)


def test_host_memory_keeps_the_recently_used_models() -> None:
    # Room for two models in host memory: a, b, a, c, a is read 3 times
    # (a, b, c) and c pushes b out, not a (used more recently).
    cfg = config(disk_gbps=50.0, host_memory_gb=2.5 * 16.06, mig="1", max_models_per_slice=1)
    reqs = [
        TraceRequest(arrival_s=100.0 * i, prompt_tokens=100, output_tokens=2, model=m)
        for i, m in enumerate("abaca")
    ]
    run = ServerlessEngine(cfg, C2CSERVE_STREAM, reqs).run()
    assert run.stats.disk_reads == 3 and run.stats.host_evictions == 1
    again = [*reqs, TraceRequest(arrival_s=600.0, prompt_tokens=100, output_tokens=2, model="b")]
    assert ServerlessEngine(cfg, C2CSERVE_STREAM, again).run().stats.disk_reads == 4


@pytest.mark.parametrize("policy", SERVERLESS_POLICY_NAMES)
def test_every_request_finishes_once(policy: str) -> None:
    reqs = trace(40, models=6)
    run = ServerlessEngine(config(), policy, reqs).run()
    outs = run.result.requests
    assert [o.id for o in outs] == [r.id for r in reqs]
    for o, r in zip(outs, reqs, strict=True):
        assert o.finish_s is not None
        assert len(o.token_times_s) == r.output_tokens
        assert o.token_times_s == sorted(o.token_times_s)
        assert o.token_times_s[0] > r.arrival_s
    m = summarize_serverless(run)
    assert m.metrics.finished == 40
    util = run.stats.link_utilization
    assert util is not None and 0.0 <= util <= 1.0 + 1e-9


@pytest.mark.parametrize("policy", (C2CSERVE, RANDOM, DEDICATED))
def test_deterministic(policy: str) -> None:
    reqs = trace(30, models=5, gap=0.1)
    a = ServerlessEngine(config(seed=3), policy, reqs).run()
    b = ServerlessEngine(config(seed=3), policy, reqs).run()
    assert [o.token_times_s for o in a.result.requests] == [
        o.token_times_s for o in b.result.requests
    ]
    assert a.switches == b.switches


@pytest.mark.parametrize(("link", "gbps"), (("pcie", PCIE_GBPS), ("c2c", 405.0)))
def test_dedicated_cold_start_is_weight_bytes_over_the_link(link: str, gbps: float) -> None:
    cfg = config(load_link=link)
    reqs = [
        TraceRequest(arrival_s=0.0, prompt_tokens=100, output_tokens=2, model="a"),
        TraceRequest(arrival_s=0.0, prompt_tokens=100, output_tokens=2, model="b"),
    ]
    run = ServerlessEngine(cfg, DEDICATED, reqs).run()
    cold = cfg.model.param_bytes / (gbps * GB)
    assert run.stats.switches == 2
    # Both loads start at 0 and share the link: each takes twice as long.
    for w in run.switches:
        assert w.latency_s == pytest.approx(2 * cold)
        assert w.load_bytes == cfg.model.param_bytes
    # The first token waits for the load.
    assert run.result.requests[0].token_times_s[0] > 2 * cold
    assert (run.stats.c2c_bytes > 0) == (link == "c2c")
    # Alone, a load takes weight bytes / the link's bandwidth.
    alone = ServerlessEngine(cfg, DEDICATED, reqs[:1]).run()
    assert alone.switches[0].latency_s == pytest.approx(cold)


def test_c2cserve_link_budget_limits_active_models() -> None:
    # TPOT 0.1 s: each 8B model needs ~160 GB/s of C2C, so the 0.9 x 405 GB/s
    # budget admits two active models on the three slices; random takes three.
    setup = build_setup(
        "llama-3-8b@h100-sxm-80gb",
        ReplayKnobs(slo=Slo(ttft_s=5.0, tbt_s=0.1), max_batched_tokens=512, max_running=16),
    )
    # Preempt any model that held its slice for Q, whatever its slack.
    cfg = serverless_config(setup, ServerlessKnobs(victim_slack_s=0.0))
    reqs = [
        TraceRequest(arrival_s=0.0, prompt_tokens=100, output_tokens=50, model=m)
        for m in ("a", "b", "c")
    ]
    inactive = ServerlessEngine(cfg, C2CSERVE_INACTIVE, reqs).run()
    assert inactive.stats.switches == 2 + 1  # the third waits for a slice to go inactive
    assert inactive.switches[-1].time_s > 0.0
    rand = ServerlessEngine(cfg, RANDOM, reqs).run()
    assert [w.time_s for w in rand.switches] == [0.0, 0.0, 0.0]
    # c2cserve-stream preempts instead (c waits W = 0.5 s, a model holds its slice
    # for Q = 2.5 s), but still never runs three models: every later switch
    # trades one of the two first slices.
    ours = ServerlessEngine(cfg, C2CSERVE_STREAM, reqs).run()
    first = {w.slice_id for w in ours.switches[:2]}
    assert [w.time_s for w in ours.switches[:2]] == [0.0, 0.0]
    assert ours.stats.switches > 3 and ours.stats.preemptions > 0
    assert all(w.slice_id in first and w.from_model for w in ours.switches[2:])
    c = 2
    assert ours.result.requests[c].token_times_s[0] < inactive.result.requests[c].token_times_s[0]
    # c2cserve keeps part of every model resident; routing reckons each at
    # what it streams sharing a 24 GB slice (16.06 - 7.90 GB per 0.1 s, ~82
    # GB/s): the three fit the budget at once, one a slice, none preempted,
    # and c starts before it does streaming.
    resident = ServerlessEngine(cfg, C2CSERVE, reqs).run()
    assert [w.time_s for w in resident.switches] == [0.0, 0.0, 0.0]
    assert len({w.slice_id for w in resident.switches}) == 3
    assert resident.stats.preemptions == 0
    assert resident.result.requests[c].token_times_s[0] < ours.result.requests[c].token_times_s[0]


def test_one_engine_runs_once() -> None:
    engine = ServerlessEngine(config(), C2CSERVE, trace(2, 1))
    engine.run()
    with pytest.raises(RuntimeError):
        engine.run()


# --- the queue-aware scheduler in the engine ----------------------------------


def one_slice(**changes: object) -> ServerlessConfig:
    """One full-GPU slice (MIG layout 1), TPOT target 0.25 s."""
    setup = build_setup(
        "llama-3-8b@h100-sxm-80gb",
        ReplayKnobs(slo=Slo(ttft_s=5.0, tbt_s=0.25), max_batched_tokens=512, max_running=16),
    )
    knobs = replace(ServerlessKnobs(mig="1"), **changes)  # type: ignore[arg-type]
    return serverless_config(setup, knobs)


def test_requests_of_one_model_batch_on_its_slice() -> None:
    reqs = [
        TraceRequest(arrival_s=0.0, prompt_tokens=100, output_tokens=6, id=f"r{i}", model="a")
        for i in range(4)
    ]
    run = ServerlessEngine(one_slice(), C2CSERVE, reqs).run()
    outs = run.result.requests
    assert run.stats.switches == 1
    # One prefill chunk per iteration (first tokens one iteration apart),
    # and every running request decodes in the same iterations: the four
    # share token times once the last one has started.
    assert len({o.token_times_s[0] for o in outs}) == 4
    shared = set.intersection(*(set(o.token_times_s) for o in outs))
    assert len(shared) >= 2


def test_two_models_share_one_slice_taking_turns() -> None:
    reqs = [
        TraceRequest(arrival_s=0.0, prompt_tokens=100, output_tokens=400, id="a", model="a"),
        TraceRequest(arrival_s=0.5, prompt_tokens=100, output_tokens=5, id="b", model="b"),
    ]
    shared = ServerlessEngine(one_slice(), C2CSERVE_STREAM, reqs).run()
    alone = ServerlessEngine(one_slice(), C2CSERVE_INACTIVE, reqs).run()
    a, b = shared.result.requests
    a_alone, b_alone = alone.result.requests
    assert shared.stats.shares == 1 and shared.stats.preemptions == 0
    assert a.finish_s is not None and b.finish_s is not None and a_alone.finish_s is not None
    # b is set up next to a at once and meets its 5 s TTFT target; without
    # sharing it waits until a is done.
    assert b.token_times_s[0] - b.arrival_s <= 5.0
    assert b_alone.token_times_s[0] >= a_alone.finish_s
    # The two take turns: b's tokens fall between a's, and a finishes later
    # than alone but within its 250 ms TPOT target.
    assert a.token_times_s[0] < b.token_times_s[0] < b.finish_s < a.finish_s
    assert a.finish_s > a_alone.finish_s
    assert (a.finish_s - a.token_times_s[0]) / (len(a.token_times_s) - 1) <= 0.25


def test_a_busy_slice_is_not_shared_and_a_busy_shared_slice_sheds() -> None:
    # a runs 4 requests on the one slice: b (arriving at 0.5) does not join
    # it under c2cserve-light-share (4 > share_max_in_flight = 2) and waits for a to be
    # done, as under dedicated; c2cserve sets b up next to it.
    busy = [
        TraceRequest(arrival_s=0.0, prompt_tokens=100, output_tokens=400, id=f"a{i}", model="a")
        for i in range(4)
    ]
    b = [TraceRequest(arrival_s=0.5, prompt_tokens=100, output_tokens=5, id="b", model="b")]
    light = ServerlessEngine(one_slice(), C2CSERVE_LIGHT_SHARE, busy + b).run()
    always = ServerlessEngine(one_slice(), C2CSERVE, busy + b).run()
    assert light.stats.shares == 0 and always.stats.shares == 1
    a_done = max(o.finish_s or 0.0 for o in light.result.requests[:4])
    assert light.result.requests[4].token_times_s[0] >= a_done
    assert always.result.requests[4].token_times_s[0] < a_done
    # On one 24 GB slice (each keeps half its weights when sharing): a and b
    # share while light (one request each); three more of a's make the
    # slice busy: b, with the fewest in flight, finishes its request and
    # leaves, and a's weights are copied back in (a top-up); under
    # c2cserve-sticky-share b holds its half.
    cfg = config(mig="3")
    cfg = replace(cfg, slices=cfg.slices[:1], slo=Slo(ttft_s=5.0, tbt_s=0.25))
    reqs = [
        TraceRequest(arrival_s=0.0, prompt_tokens=100, output_tokens=1000, id="a", model="a"),
        TraceRequest(arrival_s=0.5, prompt_tokens=100, output_tokens=200, id="b", model="b"),
        *(
            TraceRequest(arrival_s=3.0, prompt_tokens=100, output_tokens=20, id=f"x{i}", model="a")
            for i in range(3)
        ),
    ]
    run = ServerlessEngine(cfg, C2CSERVE_LIGHT_SHARE, reqs).run()
    kept = ServerlessEngine(cfg, C2CSERVE_STICKY_SHARE, reqs).run()
    assert run.stats.shares == 1 and run.stats.sheds == 1 and kept.stats.sheds == 0
    assert run.stats.preemptions == 0
    assert all(o.finish_s is not None for o in run.result.requests)
    set_up = sum(w.load_bytes for w in run.switches)
    assert set_up < 2 * cfg.model.param_bytes  # they split the slice's HBM
    assert run.stats.load_bytes > set_up  # the top-up after b left
    assert kept.stats.load_bytes == sum(w.load_bytes for w in kept.switches)


def test_starving_model_drains_the_victim_then_preempts_the_rest() -> None:
    # One model per slice: b starves after 1 s, a has held the slice for Q;
    # a's long request keeps decoding during the drain (no new requests for
    # a), then after D = 2 s what is left is preempted.
    reqs = [
        TraceRequest(arrival_s=0.0, prompt_tokens=100, output_tokens=400, id="a0", model="a"),
        TraceRequest(arrival_s=0.5, prompt_tokens=100, output_tokens=5, id="b0", model="b"),
        TraceRequest(arrival_s=2.0, prompt_tokens=100, output_tokens=5, id="a1", model="a"),
    ]
    cfg = one_slice(starve_after_s=1.0, min_hold_s=0.5, max_drain_s=2.0, victim_slack_s=1e6)
    run = ServerlessEngine(cfg, C2CSERVE_EXCLUSIVE, reqs).run()
    a0, b0, a1 = run.result.requests
    assert run.stats.drains >= 1 and run.stats.preemptions >= 1
    # b0 starves at 1.5 s; the drain ends at most 2 s (and one iteration)
    # later, then b is set up (50 ms).
    assert 1.5 + 0.05 < b0.token_times_s[0] < 1.5 + 2.0 + 0.05 + 0.5
    assert run.stats.max_drain_s == pytest.approx(2.0, abs=0.2)
    # a0 kept decoding during the drain (tokens between 1.5 s and 3.5 s) and
    # was preempted (its KV went to host memory) once the drain hit D.
    assert any(1.6 < t < 3.4 for t in a0.token_times_s)
    assert a0.preemptions >= 1 and a0.swap_outs >= 1
    # a1 arrived during the drain: it waited (a took no new requests).
    assert a1.token_times_s[0] > b0.token_times_s[0]
    for o in (a0, b0, a1):
        assert o.finish_s is not None


def test_waits_stay_within_the_reported_starvation_bound() -> None:
    # A hot model keeps the one slice busy; rare models keep arriving.
    reqs = [
        TraceRequest(
            arrival_s=0.4 * i, prompt_tokens=200, output_tokens=60, id=f"h{i}", model="hot"
        )
        for i in range(60)
    ] + [
        TraceRequest(
            arrival_s=1.0 + 3.0 * i, prompt_tokens=100, output_tokens=10, id=f"r{i}", model=f"r{i}"
        )
        for i in range(6)
    ]
    reqs.sort(key=lambda t: t.arrival_s)
    cfg = one_slice(starve_after_s=2.0, min_hold_s=1.0, max_drain_s=1.0, victim_slack_s=1e6)
    run = ServerlessEngine(cfg, C2CSERVE_EXCLUSIVE, reqs).run()
    stats = run.stats
    assert stats.starvation_bound_s is not None
    assert stats.drains > 0
    assert max(stats.placement_wait_s) <= stats.starvation_bound_s
    assert all(o.finish_s is not None for o in run.result.requests)
    # Without the backstop the rare models wait for the hot one's lulls.
    inactive = ServerlessEngine(cfg, C2CSERVE_INACTIVE, reqs).run()
    assert max(inactive.stats.placement_wait_s) > stats.starvation_bound_s


def test_kv_capacity_swaps_and_rejects() -> None:
    cfg = config()  # 3 x 24 GB; dedicated keeps 16 GB of weights in HBM
    cap = 30818  # kv_capacity_tokens(llama-3-8b, 24 GB slice, weights in HBM)
    reqs = [
        TraceRequest(arrival_s=0.0, prompt_tokens=9000, output_tokens=300, id=f"r{i}", model="a")
        for i in range(3)
    ] + [TraceRequest(arrival_s=0.0, prompt_tokens=cap + 10, output_tokens=2, id="big", model="a")]
    run = ServerlessEngine(cfg, DEDICATED, reqs).run()
    outs = {o.id: o for o in run.result.requests}
    assert run.stats.rejected == 1 and outs["big"].finish_s is None
    # 3 x (9,000 + 300) > 27,900 tokens fit at once... they do here; a
    # fourth long one would not: make the KV run out while decoding.
    for i in range(3):
        assert outs[f"r{i}"].finish_s is not None
    tight = [
        TraceRequest(arrival_s=0.0, prompt_tokens=10000, output_tokens=400, id=f"t{i}", model="a")
        for i in range(3)
    ]
    run = ServerlessEngine(cfg, DEDICATED, tight).run()
    assert run.stats.kv_swaps > 0
    assert all(o.finish_s is not None for o in run.result.requests)


@pytest.mark.parametrize(("policy", "switch_s"), ((SLLM, 1.7), (AEGAEON, 0.119)))
def test_baseline_switch_is_the_papers_when_alone_on_the_link(policy: str, switch_s: float) -> None:
    req = [TraceRequest(arrival_s=0.0, prompt_tokens=100, output_tokens=2, model="a")]
    run = ServerlessEngine(config(), policy, req).run()
    assert run.switches[0].latency_s == pytest.approx(switch_s)
    assert run.stats.c2c_bytes == pytest.approx(16.06e9, rel=1e-3)  # loaded over C2C
    # Its first request is a cold start: TTFT = switch + prefill.
    assert run.stats.cold_ttft_s[0] > switch_s


def test_shared_link_hand_checked() -> None:
    link = SharedLink(1.0)  # 1 GB/s
    link.start(0, 2e9, 0.0)
    assert link.next_finish_s() == pytest.approx(2.0)
    # A second transfer at 1 s: each gets 0.5 GB/s; 0 has 1 GB left -> 3 s.
    link.start(1, 1e9, 1.0)
    assert link.next_finish_s() == pytest.approx(3.0)
    assert link.finished(3.0) == [0, 1]  # 1 moved 1 GB at 0.5 GB/s too
    link.start(2, 4e9, 3.0)
    link.start(3, 4e9, 3.0)
    link.cancel(3, 5.0)  # 2 has 3 GB left, alone from 5 s
    assert link.next_finish_s() == pytest.approx(8.0)
    with pytest.raises(ValueError):
        link.start(2, 1.0, 6.0)


# --- c2cserve keeping weights resident ----------------------------------------


def _free_bytes(cfg: ServerlessConfig, index: int = 0) -> float:
    return cfg.slices[index].hbm_bytes * 0.9 - 1.5e9


def test_c2cserve_copies_the_weights_that_fit_then_streams_nothing() -> None:
    cfg = config()  # 3 x 24 GB: 20.1 GB for weights and KV, 16 GB of weights
    reqs = [TraceRequest(arrival_s=1.0, prompt_tokens=300, output_tokens=4, model="a")]
    run = ServerlessEngine(cfg, C2CSERVE, reqs).run()
    weights = cfg.model.param_bytes
    (switch,) = run.switches
    assert switch.load_bytes == weights
    # The copy alone on the link, then engine set-up.
    assert switch.latency_s == pytest.approx(weights / (cfg.link_gbps * GB) + cfg.switch_setup_s)
    # Only the copy crossed C2C.
    assert run.stats.c2c_bytes == pytest.approx(weights)
    assert run.result.requests[0].finish_s is not None


def test_on_a_small_slice_c2cserve_streams_and_partial_keeps_what_fits() -> None:
    cfg = config(mig="7")  # 7 x 12 GB: the 16 GB of weights cannot all stay
    reqs = [TraceRequest(arrival_s=0.0, prompt_tokens=300, output_tokens=4, model="a")]
    ours = ServerlessEngine(cfg, C2CSERVE, reqs).run()
    stream = ServerlessEngine(cfg, C2CSERVE_STREAM, reqs).run()
    assert ours.switches[0].load_bytes == 0
    assert ours.result.requests[0].token_times_s == stream.result.requests[0].token_times_s
    run = ServerlessEngine(cfg, C2CSERVE_PARTIAL, reqs).run()
    kv = cfg.kv_reserve_tokens * cfg.model.kv_bytes_per_token()
    kept = int(_free_bytes(cfg) - kv)
    assert 0 < kept < cfg.model.param_bytes
    (switch,) = run.switches
    assert switch.load_bytes == kept
    # Every pass streams the rest: 4 passes (one prefill, three decodes).
    streamed = run.stats.c2c_bytes - kept
    assert streamed >= 4 * (cfg.model.param_bytes - kept) * 0.999


def test_two_models_sharing_a_slice_split_its_hbm() -> None:
    cfg = one_slice()
    reqs = [
        TraceRequest(arrival_s=0.0, prompt_tokens=100, output_tokens=400, id="a", model="a"),
        TraceRequest(arrival_s=0.5, prompt_tokens=100, output_tokens=5, id="b", model="b"),
    ]
    run = ServerlessEngine(cfg, C2CSERVE, reqs).run()
    first, second = run.switches
    weights = cfg.model.param_bytes
    free = _free_bytes(cfg)
    # a alone: all of it. b joining: each keeps (free - KV) / 2, the KV
    # being the larger of what a holds now and the reserve for two.
    assert first.load_bytes == weights
    kv = 2 * cfg.kv_reserve_tokens * cfg.model.kv_bytes_per_token()
    level = (free - kv) / 2
    assert level < weights or second.load_bytes == weights
    assert second.load_bytes == int(min(weights, free - kv - min(weights, level)))
    assert run.stats.shares == 1
    assert all(o.finish_s is not None for o in run.result.requests)


def test_a_request_too_long_for_the_kv_left_drops_resident_weights() -> None:
    cfg = config()
    kv_token = cfg.model.kv_bytes_per_token()
    # More KV than the 24 GB slice leaves next to all the weights (30,818
    # tokens, what dedicated holds), less than it holds with none resident.
    prompt = 40_000
    assert prompt * kv_token < _free_bytes(cfg)
    reqs = [TraceRequest(arrival_s=0.0, prompt_tokens=prompt, output_tokens=3, model="a")]
    ours = ServerlessEngine(cfg, C2CSERVE, reqs).run()
    assert ours.stats.rejected == 0 and ours.result.requests[0].finish_s is not None
    assert ServerlessEngine(cfg, DEDICATED, reqs).run().stats.rejected == 1
    # Once it is done, the next request's turns copy weights back in (a
    # top-up over C2C, while the model runs).
    later = TraceRequest(arrival_s=60.0, prompt_tokens=100, output_tokens=20, model="a")
    again = ServerlessEngine(cfg, C2CSERVE, [*reqs, later]).run()
    assert again.stats.switches == 1
    assert again.stats.load_bytes >= cfg.model.param_bytes + 1e9
    assert again.stats.load_bytes <= 2 * cfg.model.param_bytes


class _CheckedEngine(ServerlessEngine):
    """Checks, before every iteration, that no slice holds more resident
    weights and KV than its HBM."""

    def _iterate(self, s, now):  # type: ignore[no-untyped-def]
        for x in self._slices:
            kv = x.kv_used * self._kv_token_bytes
            assert x.resident_bytes + kv <= x.free_bytes + 1
            assert x.kv_capacity * self._kv_token_bytes + x.resident_bytes <= x.free_bytes + 1
        super()._iterate(s, now)


@pytest.mark.parametrize(
    ("policy", "mig"),
    ((C2CSERVE, "3"), (C2CSERVE_PARTIAL, "7"), (C2CSERVE, "1"), (DEDICATED, "3")),
)
def test_resident_weights_and_kv_never_exceed_a_slices_hbm(policy: str, mig: str) -> None:
    reqs = [
        TraceRequest(
            arrival_s=0.05 * i,
            prompt_tokens=500 + 997 * (i % 7),
            output_tokens=20 + 13 * (i % 5),
            id=f"r{i}",
            model=f"m{(i * 7) % 5}",
        )
        for i in range(80)
    ]
    run = _CheckedEngine(config(mig=mig), policy, reqs).run()
    assert all(o.finish_s is not None for o in run.result.requests)


def test_a_model_with_every_weight_resident_runs_as_dedicated_runs() -> None:
    """Alone on a 24 GB slice c2cserve keeps all 16 GB resident, so it
    prefills in the static chunk (512 here: 1,500 tokens in three chunks) at
    rho 0 with the weights' HBM reads a roofline term of their own, exactly
    as dedicated does: from the moment each model is ready, the token times
    are dedicated's. c2cserve-chunked prefills in choose_chunk's smaller
    chunks, each reading the weights again, and its first token is later."""
    cfg = config()
    reqs = [TraceRequest(arrival_s=1.0, prompt_tokens=1500, output_tokens=4, model="a")]
    ours = ServerlessEngine(cfg, C2CSERVE, reqs).run()
    dedicated = ServerlessEngine(cfg, DEDICATED, reqs).run()
    chunked = ServerlessEngine(cfg, C2CSERVE_CHUNKED, reqs).run()

    def since_ready(run: ServerlessRun) -> list[float]:
        ready = 1.0 + run.switches[0].latency_s
        return [t - ready for t in run.result.requests[0].token_times_s]

    assert since_ready(ours) == pytest.approx(since_ready(dedicated), rel=1e-12)
    # Three prefill iterations and three decodes, as dedicated's.
    assert ours.stats.iterations == dedicated.stats.iterations == 3 + 3
    assert ours.stats.mean_rho == 0.0
    assert since_ready(chunked)[0] > since_ready(ours)[0]
    assert chunked.stats.iterations > ours.stats.iterations


def test_resident_reads_overlapping_cost_what_the_baselines_pass_costs() -> None:
    """With every weight resident and the reads overlapping the other HBM
    traffic, a pass takes the time of the HBM baselines' pass (their
    weights read at the slice's HBM rate in place of the link's); summed
    into the HBM traffic it takes longer, here where the weight-stationary
    partial sums already bind the slice's HBM."""
    llama = config().model
    mig = config().slices[0]
    tiles = GemmTiles()
    args = {"rho": 0.0, "mig": mig, "attended_pairs": 2048 * 1024.0, "tiles": tiles}
    baseline = model_pass_cost(llama, 2048, c2c_gbps=mig.hbm_bytes_per_s / GB, **args)  # type: ignore[arg-type]
    overlap = model_pass_cost(
        llama,
        2048,
        c2c_gbps=135.0,
        resident_fraction=1.0,
        resident_reads_overlap=True,
        **args,  # type: ignore[arg-type]
    )
    summed = model_pass_cost(llama, 2048, c2c_gbps=135.0, resident_fraction=1.0, **args)  # type: ignore[arg-type]
    assert overlap.time_s == pytest.approx(baseline.time_s, rel=1e-12)
    assert overlap.c2c_bytes == 0.0
    assert overlap.hbm_bytes == pytest.approx(summed.hbm_bytes)
    assert summed.time_s == pytest.approx(
        summed.hbm_bytes / mig.hbm_bytes_per_s + summed.overhead_s, rel=1e-12
    )
    assert summed.time_s > overlap.time_s


def test_a_second_copy_on_one_slice_starts_when_the_first_is_done() -> None:
    """a is set up on the one 96 GB slice at 0 (its 16 GB copy alone on the
    link: 39.7 ms); b arrives at 10 ms and shares the slice, keeping all its
    weights too. A slice copies one model at a time, so b's copy starts when
    a's is done and takes as long again; then b's engine set-up."""
    cfg = one_slice()
    reqs = [
        TraceRequest(arrival_s=0.0, prompt_tokens=100, output_tokens=4, id="a", model="a"),
        TraceRequest(arrival_s=0.01, prompt_tokens=100, output_tokens=4, id="b", model="b"),
    ]
    run = ServerlessEngine(cfg, C2CSERVE, reqs).run()
    copy = cfg.model.param_bytes / (cfg.link_gbps * GB)
    first, second = run.switches
    assert second.to_model == "b" and second.load_bytes == cfg.model.param_bytes
    assert first.latency_s == pytest.approx(copy + cfg.switch_setup_s)
    assert second.latency_s == pytest.approx(2 * copy + cfg.switch_setup_s - 0.01)
    assert all(o.finish_s is not None for o in run.result.requests)


def test_c2cserve_queues_a_request_whose_kv_would_evict_weights_that_make_decode_slower() -> None:
    """Eight requests of 3,800 prompt tokens decode on one 24 GB slice with
    every weight resident (30,400 of the 30,818 KV tokens that fit next to
    them). A 38,000-token prompt arrives: admitting it drops about 5.0 GB
    of weights, which then stream over a 135 GB/s link (a third of
    GH200's): nine decodes per step of ~37 ms against eight per ~20 ms, so
    c2cserve queues it until the eight are done; c2cserve-kv-first admits
    it. (On the whole 405 GB/s link the 5 GB stream within the HBM reads'
    time and c2cserve admits it too.)"""
    cfg = config(c2c_gbps=135.0)
    eight = [
        TraceRequest(arrival_s=0.0, prompt_tokens=3800, output_tokens=400, id=f"r{i}", model="a")
        for i in range(8)
    ]
    big = TraceRequest(arrival_s=5.0, prompt_tokens=38_000, output_tokens=3, id="big", model="a")
    weights = cfg.model.param_bytes
    kv_token = cfg.model.kv_bytes_per_token()
    free = _free_bytes(cfg)
    dropped = (8 * 3800 + 38_000) * kv_token - (free - weights)
    assert 4.9e9 < dropped < 5.1e9
    probe = ServerlessEngine(cfg, C2CSERVE, [])
    s = probe._slices[0]

    def rate(n: int, context: int, kept: float) -> float:
        cost = model_pass_cost(
            cfg.model,
            n,
            rho=0.0,
            mig=s.profile,
            c2c_gbps=cfg.link_gbps,
            attended_pairs=float(context),
            kv_read_tokens=float(context),
            tiles=probe._tiles(s, n),
            resident_fraction=kept / weights,
            resident_reads_overlap=True,
        )
        return n / cost.time_s

    without = rate(8, 8 * 3800, weights)
    with_big = rate(9, 8 * 3800 + 38_000, weights - dropped)
    assert with_big < 0.7 * without, (with_big, without)

    ours = ServerlessEngine(cfg, C2CSERVE, [*eight, big]).run()
    first = ServerlessEngine(cfg, C2CSERVE_KV_FIRST, [*eight, big]).run()
    for run in (ours, first):
        assert all(o.finish_s is not None for o in run.result.requests)
    last_of_eight = max(o.finish_s or 0.0 for o in ours.result.requests if o.id != "big")
    ours_big = next(o for o in ours.result.requests if o.id == "big")
    first_big = next(o for o in first.result.requests if o.id == "big")
    assert ours_big.token_times_s[0] >= last_of_eight
    first_eight_done = max(o.finish_s or 0.0 for o in first.result.requests if o.id != "big")
    assert first_big.token_times_s[0] < first_eight_done
    # Waiting kept the eight's decodes at the all-resident step (~20 ms
    # once their prefills are done); admitting the big prompt slowed them
    # (to 87-140 ms a step while it prefilled), so the last ends ~2.5 s later.
    assert last_of_eight + 2.0 < first_eight_done


def test_c2cserve_kv_cap_drops_weights_only_for_a_request_alone() -> None:
    """The eight requests and the 38,000-token prompt above, on the whole
    405 GB/s link: streaming 5 GB takes ~12 ms, within the resident
    weights' HBM reads, so c2cserve admits the prompt next to the eight;
    c2cserve-kv-cap holds it back while any request runs and, once it is
    alone, drops the weights its KV needs instead of rejecting it."""
    cfg = config()
    eight = [
        TraceRequest(arrival_s=0.0, prompt_tokens=3800, output_tokens=400, id=f"r{i}", model="a")
        for i in range(8)
    ]
    big = TraceRequest(arrival_s=5.0, prompt_tokens=38_000, output_tokens=3, id="big", model="a")
    for policy, waits in ((C2CSERVE, False), (C2CSERVE_KV_CAP, True)):
        run = ServerlessEngine(cfg, policy, [*eight, big]).run()
        assert run.stats.rejected == 0
        assert all(o.finish_s is not None for o in run.result.requests)
        last_of_eight = max(o.finish_s or 0.0 for o in run.result.requests if o.id != "big")
        first_token = next(o for o in run.result.requests if o.id == "big").token_times_s[0]
        assert (first_token >= last_of_eight) == waits, policy


def _slices(n: int) -> ServerlessConfig:
    """The first ``n`` slices of 3 x 24 GB (each holds one Llama-3-8B)."""
    cfg = config(mig="3")
    return replace(cfg, slices=cfg.slices[:n], slo=Slo(ttft_s=5.0, tbt_s=0.25))


def test_a_resident_with_nothing_in_flight_gives_its_hbm_back() -> None:
    # b joins a's slice, each keeping half its weights; once b's request is
    # done it leaves (c2cserve) and a's weights are copied back in, so a's
    # last steps are those of a alone; under c2cserve-sticky-share b keeps
    # its half and a streams the rest to the end.
    cfg = _slices(1)
    a = TraceRequest(arrival_s=0.0, prompt_tokens=100, output_tokens=1000, id="a", model="a")
    b = TraceRequest(arrival_s=0.5, prompt_tokens=100, output_tokens=20, id="b", model="b")
    ends = ServerlessEngine(cfg, C2CSERVE, [a, b]).run()
    sticky = ServerlessEngine(cfg, C2CSERVE_STICKY_SHARE, [a, b]).run()
    alone = ServerlessEngine(cfg, C2CSERVE, [a]).run()
    assert ends.stats.share_ends == (("give-up", 1),) and sticky.stats.share_ends == ()
    assert ends.stats.shares == sticky.stats.shares == 1
    assert ends.stats.preemptions == 0
    # b ran the same in both; a tops up after it left (more than the set-ups).
    assert ends.result.requests[1].token_times_s == sticky.result.requests[1].token_times_s
    assert ends.stats.load_bytes > sum(w.load_bytes for w in ends.switches)
    a_ends, a_sticky, a_alone = (r.result.requests[0] for r in (ends, sticky, alone))
    assert a_ends.finish_s is not None and a_sticky.finish_s is not None
    assert a_ends.finish_s < a_sticky.finish_s
    gap = a_ends.token_times_s[-1] - a_ends.token_times_s[-2]
    assert gap == pytest.approx(a_alone.token_times_s[-1] - a_alone.token_times_s[-2], rel=1e-9)
    assert gap < a_sticky.token_times_s[-1] - a_sticky.token_times_s[-2]


def test_of_two_busy_residents_one_moves_to_a_slice_that_frees_up() -> None:
    # Two slices: a and c start alone, b shares a's slice; c's short request
    # ends and its slice is free, so one of the two busy models moves there
    # (its request preempted, KV out and back in) and both run alone with
    # every weight resident. Under c2cserve-sticky-share they take turns to
    # the end while c's slice idles.
    cfg = _slices(2)
    reqs = [
        TraceRequest(arrival_s=0.0, prompt_tokens=100, output_tokens=1000, id="a", model="a"),
        TraceRequest(arrival_s=0.0, prompt_tokens=100, output_tokens=30, id="c", model="c"),
        TraceRequest(arrival_s=0.5, prompt_tokens=100, output_tokens=1000, id="b", model="b"),
    ]
    ends = ServerlessEngine(cfg, C2CSERVE, reqs).run()
    sticky = ServerlessEngine(cfg, C2CSERVE_STICKY_SHARE, reqs).run()
    assert ends.stats.shares == sticky.stats.shares == 1
    assert dict(ends.stats.share_ends) == {"move": 1}
    assert ends.stats.preemptions == 1 and sticky.stats.preemptions == 0
    assert all(o.finish_s is not None for o in ends.result.requests)
    done = max(o.finish_s or 0.0 for o in ends.result.requests)
    done_sticky = max(o.finish_s or 0.0 for o in sticky.result.requests)
    assert done < 0.6 * done_sticky
    moved = next(o for o in ends.result.requests if o.preemptions)
    assert moved.id in ("a", "b") and moved.swap_outs == 1 and moved.swap_ins == 1


def test_of_two_busy_residents_one_waits_while_its_requests_keep_their_targets() -> None:
    # One slice on the link's third (135 GB/s, as with three slices
    # streaming), a and b each decoding 1,000 tokens: sharing, each streams
    # half its weights (~60 ms a step against ~20 ms alone; on the whole
    # link streaming half takes no longer than reading it from HBM, and the
    # share would go on) and they take turns. No slice is free, but the
    # tokens left can make up for a wait (at ~20 ms a step alone against
    # the 250 ms target), so one of them goes back to wait for the other's
    # work (its KV to host memory) and both run alone with every weight
    # resident.
    cfg = replace(_slices(1), link_gbps=135.0)
    reqs = [
        TraceRequest(arrival_s=0.0, prompt_tokens=100, output_tokens=1000, id="a", model="a"),
        TraceRequest(arrival_s=0.5, prompt_tokens=100, output_tokens=1000, id="b", model="b"),
    ]
    ends = ServerlessEngine(cfg, C2CSERVE, reqs).run()
    sticky = ServerlessEngine(cfg, C2CSERVE_STICKY_SHARE, reqs).run()
    assert dict(ends.stats.share_ends) == {"queue": 1}
    assert ends.stats.preemptions == 1
    done = [o.finish_s for o in ends.result.requests]
    assert all(d is not None for d in done)
    assert max(d or 0.0 for d in done) < max(o.finish_s or 0.0 for o in sticky.result.requests)
    # Both keep their TPOT target, the one that waited included.
    for o in ends.result.requests:
        assert (o.token_times_s[-1] - o.token_times_s[0]) / (len(o.token_times_s) - 1) <= 0.25
    waited = next(o for o in ends.result.requests if o.preemptions)
    other = next(o for o in ends.result.requests if not o.preemptions)
    gaps = [b - a for a, b in zip(waited.token_times_s, waited.token_times_s[1:], strict=False)]
    assert max(gaps) > 5.0  # it waited for the other's work
    assert other.finish_s is not None and other.finish_s <= waited.token_times_s[-1]
