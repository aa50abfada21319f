"""From a profile and knobs to a long-context offload run's config
(longctx_engine): per-layer KV blocks, the GPU budget and link bandwidth in
them, and the paper-style TBT SLO (``slo_scale`` times a base latency)."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.domain.offload import OffloadParams
from planner.domain.requests import Slo
from planner.policies.offload import ControllerConfig
from planner.replay.longctx_engine import LongctxConfig
from planner.replay.longctx_policies import OffloadSetup
from planner.replay.setup import ReplaySetup
from planner.trace.records import TraceRequest

# Replay stops orbitflow's solves on work, not on the clock, so a run gives
# the same plans on any machine (DESIGN.md §4); the time limit is a backstop.
# 4,000 nodes: one plan (Pause-Resume rounds included) in about 10-20 ms on
# the shared 2-core machine of docs/replay.md, 8 requests x 32 layers. The
# ILP backends (--offload-backend cp-sat/gurobi) stop on deterministic work
# as well: 0.05, the service's default time limit in their work units.
REPLAY_OFFLOAD_PARAMS = OffloadParams(time_limit_s=10.0, node_limit=4000, ilp_work_limit=0.05)


@dataclass(frozen=True, slots=True)
class LongctxKnobs:
    max_running: int = 8
    # GPU memory for KV, bytes; None: what the profile leaves (setup.engine).
    gpu_kv_bytes: int | None = None
    # TBT SLO = slo_scale x base_tbt_s(...) when given, else slo.tbt_s.
    slo_scale: float | None = None
    jitter_cv: float = 0.0
    seed: int = 0
    params: OffloadParams = REPLAY_OFFLOAD_PARAMS
    controller: ControllerConfig = field(default_factory=ControllerConfig)


def base_tbt_s(setup: ReplaySetup, gpu_block_budget: int, max_running: int) -> float:
    """OrbitFlow's base SLO (§5.1: the decode latency of the longest work
    served without offloading): one decode step of max_running requests whose
    KV fills the whole GPU budget, nothing offloaded."""
    layers = setup.model.num_layers
    tokens = gpu_block_budget // layers * setup.engine.block_size_tokens
    return setup.cost.iteration_time_s(0, max_running, tokens)


def longctx_config(setup: ReplaySetup, knobs: LongctxKnobs) -> tuple[LongctxConfig, OffloadSetup]:
    """Raises ValueError when the knobs leave no room for KV."""
    e = setup.engine
    layers = setup.model.num_layers
    layer_block_bytes = e.block_bytes // layers
    if knobs.gpu_kv_bytes is not None:
        budget = int(knobs.gpu_kv_bytes // layer_block_bytes)
    else:
        budget = e.gpu_kv_blocks * layers
    if budget <= 0:
        raise ValueError("the GPU KV memory holds no block")
    link = setup.hardware.h2d_gbps * 1e9 / layer_block_bytes
    slo = e.slo
    if knobs.slo_scale is not None:
        slo = Slo(
            ttft_s=slo.ttft_s, tbt_s=knobs.slo_scale * base_tbt_s(setup, budget, knobs.max_running)
        )
    config = LongctxConfig(
        num_layers=layers,
        gpu_block_budget=budget,
        link_blocks_per_s=link,
        layer_block_bytes=layer_block_bytes,
        block_size_tokens=e.block_size_tokens,
        max_running=knobs.max_running,
        slo=slo,
        jitter_cv=knobs.jitter_cv,
        seed=knobs.seed,
    )
    offload = OffloadSetup(
        num_layers=layers,
        block_size_tokens=e.block_size_tokens,
        gpu_block_budget=budget,
        link_blocks_per_s=link,
        max_running=knobs.max_running,
        params=knobs.params,
        controller=knobs.controller,
    )
    return config, offload


def design_tokens(trace: list[TraceRequest]) -> int:
    """FlexGen's design request length: the trace's mean final length."""
    if not trace:
        return 1
    return round(sum(t.prompt_tokens + t.output_tokens for t in trace) / len(trace))
