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
from planner.replay.serverless_engine import (
    C2CSERVE,
    C2CSERVE_INACTIVE,
    DEDICATED,
    RANDOM,
    SERVERLESS_POLICY_NAMES,
    STATIC_CHUNK,
    ServerlessConfig,
    ServerlessEngine,
)
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
    # c2cserve preempts instead (c waits W = 0.5 s, a model holds its slice
    # for Q = 2.5 s), but still never runs three models: every later switch
    # trades one of the two first slices.
    ours = ServerlessEngine(cfg, C2CSERVE, reqs).run()
    first = {w.slice_id for w in ours.switches[:2]}
    assert [w.time_s for w in ours.switches[:2]] == [0.0, 0.0]
    assert ours.stats.switches > 3 and ours.stats.preemptions > 0
    assert all(w.slice_id in first and w.from_model for w in ours.switches[2:])
    c = 2
    assert ours.result.requests[c].token_times_s[0] < inactive.result.requests[c].token_times_s[0]


def test_one_engine_runs_once() -> None:
    engine = ServerlessEngine(config(), C2CSERVE, trace(2, 1))
    engine.run()
    with pytest.raises(RuntimeError):
        engine.run()
