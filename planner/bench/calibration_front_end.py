"""The front end of a calibrated replay, request by request, and where vLLM's
own TTFT clock starts in it.

A client's TTFT runs from sending the request; vLLM's own (its
time_to_first_token histogram) from the API server's renderer taking the
request up (vllm.renderers: the arrival time stamped before tokenization)
to the front end's handling of the engine core's output. A request that
arrives while the front end is busy (other requests' admissions, the running
requests' streamed tokens) waits before the renderer takes it: that wait is
in the client's TTFT and not in vLLM's. In the replay's front end (one server
serving admissions and streamed tokens in the order they come,
planner.replay.engine.front_end_passage_s) a request's wait splits the same
way: the queue wait and its own admission come before the clock (the front
end takes the request up when its admission is done); after it, its
tokenization where the profile gives one (tokenize_s_per_prompt_token: back
in line on the same server, behind what came in meanwhile, as vLLM's
renderer tokenizes after its stamp while the API server's one event loop
and tokenizer thread serve everyone), then a constant clock_to_engine_s (the
rest: input processing, the hand-over to the engine core, the output's way
back). So the replay's vLLM TTFT of a request is its first token's time
less the time the front end took it up, plus clock_to_engine_s.

The replays here run in process (the same engine, schedulers and front-end
passes as `planner replay`), so that every request's token times are at
hand."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from planner.domain.requests import Slo
from planner.replay.batching_core import EngineConfig
from planner.replay.cfs_paging import paging_target
from planner.replay.cfs_scheduler import CfsKnobs
from planner.replay.engine import (
    Engine,
    admission_exits_s,
    front_end_passage_s,
    has_front_end,
    run_through_front_end,
)
from planner.replay.noise import JitteredCost
from planner.replay.records import ReplayResult
from planner.replay.scheduler_by_name import SCHEDULERS, make_scheduler
from planner.replay.setup import ReplayKnobs, build_setup
from planner.trace.records import TraceRequest


def replay_in_process(
    trace: Sequence[TraceRequest],
    profile: str,
    policy: str,
    knobs: ReplayKnobs,
    *,
    jitter_cv: float = 0.0,
    seed: int = 0,
) -> tuple[ReplayResult, EngineConfig]:
    """The replay `planner replay TRACE --profile PROFILE --policy POLICY
    --compute-jitter JITTER_CV --seed SEED` runs with these knobs (its
    defaults otherwise), and the engine config it ran with."""
    setup = build_setup(profile, knobs)
    engine_config, link = paging_target(
        SCHEDULERS[policy].paging, setup.engine, setup.link, setup.hardware, peer_kv_bytes=0
    )
    cfs = CfsKnobs(setup.engine.max_batched_tokens)

    def make_engine(admitted_s: Sequence[float] | None) -> Engine:
        # Every pass gets a generator seeded alike, as `planner replay`'s.
        cost = JitteredCost(setup.cost, jitter_cv, seed) if jitter_cv > 0 else setup.cost
        return Engine(
            engine_config,
            make_scheduler(policy, setup.rotation, cfs),
            cost,
            link,
            trace,
            admitted_s=admitted_s,
        )

    result, _, _ = run_through_front_end(engine_config, trace, make_engine)
    return result, engine_config


def calibration_knobs(
    *,
    slo_ttft_s: float,
    slo_tbt_s: float,
    block_size: int,
    gpu_kv_blocks: int,
    cpu_kv_blocks: int,
    max_batched_tokens: int,
    max_running: int,
) -> ReplayKnobs:
    return ReplayKnobs(
        slo=Slo(ttft_s=slo_ttft_s, tbt_s=slo_tbt_s),
        block_size_tokens=block_size,
        gpu_kv_blocks=gpu_kv_blocks,
        cpu_kv_blocks=cpu_kv_blocks,
        max_batched_tokens=max_batched_tokens,
        max_running=max_running,
    )


def front_end_passage(
    result: ReplayResult, config: EngineConfig
) -> tuple[list[float], list[float]]:
    """When each request of result (in its order) was taken up by the front
    end and when it left it and reached the engine: after the request
    latency, its admission and, with streaming work, the tokens streamed
    before it; then its tokenization, if the config has one (at the front
    end's fixed point, the arrivals the last pass ran with)."""
    entries_s = [r.arrival_s + config.request_latency_s for r in result.requests]
    if has_front_end(config):
        tokens_s = [t for r in result.requests for t in r.token_times_s]
        return front_end_passage_s(
            entries_s,
            config.admission_s_per_request,
            tokens_s,
            config.stream_s_per_token,
            config.stream_s_per_step,
            prompt_tokens=[r.prompt_tokens for r in result.requests],
            tokenize_s_per_token=config.tokenize_s_per_prompt_token,
        )
    if config.admission_s_per_request > 0:
        exits = admission_exits_s(entries_s, config.admission_s_per_request)
        return exits, exits
    return entries_s, entries_s


def engine_reached_s(result: ReplayResult, config: EngineConfig) -> list[float]:
    """When each request of result (in its order) reached the engine
    (front_end_passage)."""
    return front_end_passage(result, config)[1]


def time_to_engine_first_token_s(result: ReplayResult, config: EngineConfig) -> list[float]:
    """Each request's first token time less the time the front end took it
    up (requests with a token only): vLLM's own TTFT with clock_to_engine_s
    0 (its tokenization, where the config has one, is after the clock)."""
    taken_up, _ = front_end_passage(result, config)
    return [
        r.token_times_s[0] - at
        for r, at in zip(result.requests, taken_up, strict=True)
        if r.token_times_s
    ]


def engine_ttft_quantiles(
    to_first_token_s: Sequence[float], clock_to_engine_s: float, quantiles: Sequence[float]
) -> list[float | None]:
    """vLLM's own TTFT quantiles as the replay predicts them: each request's
    time from reaching the engine to its first token, plus the time between
    vLLM's clock start and its reaching the engine (None without requests).
    The percentiles are the replay's metrics' (numpy's linear)."""
    if not to_first_token_s:
        return [None for _ in quantiles]
    samples = np.asarray(to_first_token_s, dtype=np.float64) + clock_to_engine_s
    return [float(v) for v in np.percentile(samples, [100 * q for q in quantiles])]
