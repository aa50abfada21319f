"""The long-context replay topology: one engine whose decode steps fetch
offloaded KV layers over the CPU-GPU link (DESIGN.md §3.2, §4; OrbitFlow),
wired from the shared pieces: the single-engine topology (planner.replay.
engine: its events on the replay's event loop) and batching core with

- the core's KV-residency strategy of the LongctxPolicy
  (planner.replay.layer_residency.LayerResidency: who decodes, which layers
  stay on the GPU, the step timed by the event model, Token-Deposit),
- its admission that reserves for the final length
  (layer_residency.FinalLengthAdmission, the core's scheduler), and
  rejection on arrival of what the policy cannot place alone,
- whole-prompt prefills in iterations of their own
  (EngineConfig.prefills_alone: vLLM's default without chunked prefill; the
  cost model's time with the prompts' causal attention pairs).

The core's own block pool counts each request's KV in all layers as one
block per block_size tokens and never limits (the policy's per-layer budget
does); memory never exceeds the budget by construction and every decode step
checks it (``over_budget_steps`` counts violations, which would be a bug).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from planner.domain.requests import Slo
from planner.replay.batching_core import EngineConfig, request_outcomes
from planner.replay.engine import Engine
from planner.replay.layer_residency import FinalLengthAdmission, LayerResidency
from planner.replay.longctx_policies import LongctxPolicy
from planner.replay.models import AttentionPairsCost
from planner.replay.records import ReplayResult
from planner.replay.solve_tally import SolveSummary
from planner.replay.state import Phase
from planner.trace.records import TraceRequest


@dataclass(frozen=True, slots=True)
class LongctxConfig:
    num_layers: int
    gpu_block_budget: int
    link_blocks_per_s: float
    layer_block_bytes: int
    block_size_tokens: int = 16
    max_running: int = 8
    slo: Slo = field(default_factory=Slo)
    drain_limit_s: float = 3600.0
    jitter_cv: float = 0.0
    seed: int = 0


@dataclass(frozen=True, slots=True)
class LongctxStats:
    """What the offload topology adds to a run's ReplayResult."""

    policy: str
    decode_steps: int
    prefill_iterations: int
    replans: int
    replan_reasons: dict[str, int]
    pauses: int
    resumes: int
    rejected: int
    plan_wall_s: float
    run_wall_s: float
    solver_time_share: float | None
    peak_gpu_blocks: float
    gpu_block_budget: int
    mean_gpu_use: float | None
    over_budget_steps: int
    fetched_blocks: int
    decode_s: float
    prefill_s: float
    stall_s: float
    plan_sources: dict[str, int]
    solves: SolveSummary


@dataclass(frozen=True, slots=True)
class LongctxRun:
    result: ReplayResult
    stats: LongctxStats


class LongctxEngine:
    def __init__(
        self,
        config: LongctxConfig,
        policy: LongctxPolicy,
        cost: AttentionPairsCost,
        trace: Sequence[TraceRequest],
    ) -> None:
        self.config = config
        self.policy = policy
        self.trace = trace
        c = config
        ids = [t.id if t.id is not None else f"r{i}" for i, t in enumerate(trace)]
        if len(set(ids)) != len(ids):
            raise ValueError("trace request ids must be unique")
        final_tokens = np.array([t.prompt_tokens + t.output_tokens for t in trace], dtype=np.int64)
        final_blocks = -(-final_tokens // c.block_size_tokens)
        self.residency = LayerResidency(
            policy,
            cost,
            ids,
            num_layers=c.num_layers,
            gpu_block_budget=c.gpu_block_budget,
            link_blocks_per_s=c.link_blocks_per_s,
            layer_block_bytes=c.layer_block_bytes,
            block_size_tokens=c.block_size_tokens,
            jitter_cv=c.jitter_cv,
            seed=c.seed,
        )
        # Neither the core's pool nor its token budget ever limits: every
        # request at its final length fits, and a budget of every token of
        # the trace (and one per request) takes any prefill whole.
        core = EngineConfig(
            gpu_kv_blocks=max(int(final_blocks.sum()), 1),
            cpu_kv_blocks=0,
            block_bytes=c.layer_block_bytes * c.num_layers,
            block_size_tokens=c.block_size_tokens,
            max_batched_tokens=int(final_tokens.sum()) + len(trace) + 1,
            max_running=c.max_running,
            slo=c.slo,
            drain_limit_s=c.drain_limit_s,
            prefills_alone=True,
        )
        self.engine = Engine(
            core,
            FinalLengthAdmission(policy, final_blocks),
            cost,
            None,
            trace,
            pairs_cost=cost,
            residency=self.residency,
            rejects=self.residency.never_fits(final_blocks),
        )

    def run(self, progress: Callable[[float], None] | None = None) -> LongctxRun:
        started = time.perf_counter()
        planned_before = self.policy.plan_wall_s
        engine = self.engine
        residency = self.residency
        engine.drive(progress)
        residency.end(engine.now_s)
        # Planning done before the run (a static plan) counts in both.
        wall = time.perf_counter() - started + planned_before
        c = self.config
        p = self.policy
        totals = replace(
            engine.totals(wall),
            preemptions=p.pauses,
            swap_outs=p.pauses,
            swap_ins=p.resumes,
            peak_gpu_kv_blocks=math.ceil(residency.peak_gpu_blocks),
            gpu_kv_blocks_total=c.gpu_block_budget,
        )
        outcomes = request_outcomes(
            engine.requests,
            self.trace,
            engine.state.tokens,
            c.slo,
            token_times=residency.token_times(),
        )
        result = ReplayResult(
            policy=p.name, requests=outcomes, timeline=engine.timeline, totals=totals
        )
        rejected = int(np.count_nonzero(engine.requests.phase == Phase.REJECTED))
        stats = LongctxStats(
            policy=p.name,
            decode_steps=residency.steps,
            prefill_iterations=residency.prefills,
            replans=p.replans,
            replan_reasons=dict(sorted(p.reasons.items())),
            pauses=p.pauses,
            resumes=p.resumes,
            rejected=rejected,
            plan_wall_s=p.plan_wall_s,
            run_wall_s=wall,
            solver_time_share=p.plan_wall_s / wall if wall > 0 else None,
            peak_gpu_blocks=residency.peak_gpu_blocks,
            gpu_block_budget=c.gpu_block_budget,
            mean_gpu_use=residency.mean_gpu_use(),
            over_budget_steps=residency.over_budget_steps,
            fetched_blocks=residency.fetched_blocks,
            decode_s=residency.decode_s,
            prefill_s=residency.prefill_s,
            stall_s=totals.stall_s,
            plan_sources=dict(sorted(getattr(p, "plan_sources", {}).items())),
            solves=p.solve_tally.summary(),
        )
        return LongctxRun(result, stats)
