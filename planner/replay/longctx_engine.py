"""The long-context replay topology: one engine whose decode steps fetch
offloaded KV layers over the CPU-GPU link (DESIGN.md §3.2, §4; OrbitFlow).

Model (simulated time only; wall clock only for the planning share):

- **Blocks** are one layer's KV blocks (planner.domain.offload): a request
  holding n KV tokens has ceil(n / block_size) blocks in every layer. The
  GPU budget and the link bandwidth are counted in them.
- **Admission** (vLLM-like continuous batching, FCFS, no skipping): the head
  of the queue joins when fewer than ``max_running`` requests are running
  (paused ones count) and the policy can place the running requests and it
  at their *final* length (prompt + output tokens) with its most offloading
  option (``LongctxPolicy.fits``) — the engine reserves for the whole
  length, like a scheduler that knows output lengths, so no request is ever
  preempted for memory. A request the policy cannot place even alone is
  rejected on arrival (reported unfinished, counted).
- **Prefill**: the admitted requests are prefilled together in one
  iteration that runs alone (vLLM's default without chunked prefill): the
  cost model's ``iteration_time_s(P, 0, P, pairs)`` with P the prompt tokens
  and pairs the causal attention pairs. Each request's first token comes at
  its end (TTFT). Offloaded layers' KV is written to CPU as the prefill goes
  (hidden, not timed).
- **Decode step**: the policy decides who decodes (paused requests don't)
  and which layers of each stay on GPU. Per-layer compute is the cost
  model's decode iteration time of the decoding rows (``iteration_time_s(0,
  R, sum of contexts)``) split evenly over the L layers. The step's latency
  is the exact event model (planner.policies.offload.event_model) of those
  blocks and resident layers, or DeepSpeed's double-buffered pipeline
  (longctx_policies.double_buffered_step_s). A layer a plan newly keeps on
  GPU is fetched once, in the first step of the plan (timed as offloaded
  then); a layer newly offloaded costs nothing (its CPU copy is kept by
  write-through); a paused request's KV leaves the GPU (a resumed one
  fetches its resident layers once).
- **Output path**: OrbitFlow's tokens go through Token-Deposit (released one
  per TBT SLO while the deposit holds tokens; the rest flushed at finish);
  the user-visible release times are the token times the metrics see. The
  baselines emit each token at the end of its step.
- **Noise** (``jitter_cv``): each iteration's compute is multiplied by a
  seeded lognormal factor of mean 1; OrbitFlow's controller sees the ratio
  observed / profiled per layer and re-plans on a mismatch.

Memory never exceeds the budget by construction; every decode step checks
it (``over_budget_steps`` counts violations, which would be a bug).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from planner.domain.requests import Slo
from planner.policies.offload import StepInputs, TokenDeposit
from planner.policies.offload.deposit import DepositEvents
from planner.policies.offload.event_model import step_latency_s
from planner.profiles.cost import IterationCostModel
from planner.replay.longctx_policies import (
    BoolArray,
    FloatArray,
    IntArray,
    LongctxPolicy,
    StepView,
    double_buffered_step_s,
)
from planner.replay.records import ReplayResult, ReplayTotals, RequestOutcome, TimelineSample
from planner.replay.solve_tally import SolveSummary
from planner.trace.records import TraceRequest


class LongctxCost(Protocol):
    """The iteration cost the engine needs (IterationCostModel has it)."""

    def iteration_time_s(
        self,
        prefill_tokens: int,
        decode_tokens: int,
        attended_context_tokens: int,
        prefill_attention_pairs: int = 0,
    ) -> float: ...


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
        cost: LongctxCost,
        trace: Sequence[TraceRequest],
    ) -> None:
        self.config = config
        self.policy = policy
        self.cost = cost
        self.trace = trace
        c = config
        self.outcomes = [
            RequestOutcome(
                id=t.id if t.id is not None else f"r{i}",
                arrival_s=t.arrival_s,
                prompt_tokens=t.prompt_tokens,
                output_tokens=t.output_tokens,
                slo_ttft_s=t.slo_ttft_s if t.slo_ttft_s is not None else c.slo.ttft_s,
                slo_tbt_s=t.slo_tbt_s if t.slo_tbt_s is not None else c.slo.tbt_s,
            )
            for i, t in enumerate(trace)
        ]
        ids = [o.id for o in self.outcomes]
        if len(set(ids)) != len(ids):
            raise ValueError("trace request ids must be unique")
        self.order = sorted(range(len(trace)), key=lambda i: (trace[i].arrival_s, i))
        self.prompt = np.array([t.prompt_tokens for t in trace], dtype=np.int64)
        self.output = np.array([t.output_tokens for t in trace], dtype=np.int64)
        bs = c.block_size_tokens
        self.final_blocks = -(-(self.prompt + self.output) // bs)
        self.generated = np.zeros(len(trace), dtype=np.int64)
        self.on_gpu: dict[int, BoolArray] = {}
        self.deposit = TokenDeposit() if policy.uses_deposit else None
        self._rng = np.random.default_rng(c.seed)
        sigma2 = math.log1p(c.jitter_cv**2)
        self._sigma = math.sqrt(sigma2)
        self._mu = -sigma2 / 2
        self.now_s = 0.0
        self.timeline: list[TimelineSample] = []
        self.running: list[int] = []
        self.waiting: deque[int] = deque()
        self.rejected = 0
        self.finished = 0
        self._steps = 0
        self._prefills = 0
        self._decode_s = 0.0
        self._prefill_s = 0.0
        self._stall_s = 0.0
        self._fetched = 0
        self._peak = 0.0
        self._use_time = 0.0
        self._over = 0
        self._row_of = {o.id: i for i, o in enumerate(self.outcomes)}

    # -- helpers ------------------------------------------------------------

    def _noise(self) -> float:
        if self.config.jitter_cv == 0.0:
            return 1.0
        return float(self._rng.lognormal(self._mu, self._sigma))

    def _emit(self, events: DepositEvents) -> None:
        for release in events.releases:
            self.outcomes[self._row_of[release.request_id]].token_times_s.append(release.released_s)

    def _token(self, row: int) -> None:
        """Row produced a token at now_s."""
        self.generated[row] += 1
        out = self.outcomes[row]
        first = self.generated[row] == 1
        if self.deposit is None or first:
            out.token_times_s.append(self.now_s)
            if self.deposit is not None:
                self.deposit.open(out.id, self.now_s, out.slo_tbt_s)
        else:
            self._emit(self.deposit.deposit(out.id, self.now_s))

    def _finish(self, row: int) -> None:
        out = self.outcomes[row]
        out.finish_s = self.now_s
        if self.deposit is not None:
            self._emit(self.deposit.finish(out.id, self.now_s))
        self.policy.finish_request(out.id)
        self.on_gpu.pop(row, None)
        self.finished += 1

    # -- the loop -------------------------------------------------------------

    def run(self, progress: Callable[[float], None] | None = None) -> LongctxRun:
        started = time.perf_counter()
        planned_before = self.policy.plan_wall_s
        c = self.config
        arrivals = self.order
        last_arrival = self.trace[arrivals[-1]].arrival_s if arrivals else 0.0
        stop_after = last_arrival + c.drain_limit_s
        next_arrival = 0
        while True:
            while (
                next_arrival < len(arrivals)
                and self.trace[arrivals[next_arrival]].arrival_s <= self.now_s
            ):
                row = arrivals[next_arrival]
                next_arrival += 1
                if self.policy.fits(self.final_blocks[[row]]):
                    self.waiting.append(row)
                else:
                    self.rejected += 1
            if not self.running and not self.waiting:
                if next_arrival >= len(arrivals):
                    break
                self.now_s = max(self.now_s, self.trace[arrivals[next_arrival]].arrival_s)
                continue
            if self.now_s > stop_after:
                break
            admitted = self._admit()
            if admitted:
                self._prefill(admitted)
            else:
                self._decode_step()
            if progress is not None:
                progress(self.now_s)
        if self.deposit is not None:
            self._emit(self.deposit.advance(self.now_s))
        # Planning done before the run (a static plan) counts in both.
        wall = time.perf_counter() - started + planned_before
        return self._result(wall)

    def _admit(self) -> list[int]:
        admitted: list[int] = []
        c = self.config
        while self.waiting and len(self.running) + len(admitted) < c.max_running:
            head = self.waiting[0]
            trial = self.final_blocks[[*self.running, *admitted, head]]
            if not self.policy.fits(trial):
                break
            admitted.append(self.waiting.popleft())
        return admitted

    def _prefill(self, rows: list[int]) -> None:
        prompts = [int(self.prompt[r]) for r in rows]
        total = sum(prompts)
        pairs = sum(IterationCostModel.prefill_attention_pairs(p) for p in prompts)
        t = self.cost.iteration_time_s(total, 0, total, pairs) * self._noise()
        self.now_s += t
        self._prefill_s += t
        self._prefills += 1
        for r in rows:
            self._token(r)
            if self.generated[r] >= self.output[r]:
                self._finish(r)
            else:
                self.running.append(r)
                # The prefill computed every layer's KV on the GPU.
                self.on_gpu[r] = np.ones(self.config.num_layers, dtype=np.bool_)
        self._sample(t, 0.0, 0.0, prefill_tokens=total, decode_tokens=0)

    def _decode_step(self) -> None:
        c = self.config
        policy = self.policy
        rows_all = np.array(self.running, dtype=np.int64)
        num_tokens = self.prompt[rows_all] + self.generated[rows_all] - 1
        blocks = -(-(num_tokens + 1) // c.block_size_tokens)
        ids = tuple(self.outcomes[r].id for r in self.running)
        deposits = (
            self.deposit.balance_array(ids)
            if self.deposit is not None
            else np.zeros(len(ids), dtype=np.int64)
        )
        slo = np.array([self.outcomes[r].slo_tbt_s for r in self.running], dtype=np.float64)
        view = StepView(
            step=self._steps,
            ids=ids,
            num_tokens=num_tokens,
            blocks=blocks,
            deposited_tokens=deposits,
            slo_tbt_s=slo,
            comp_s=self._layer_comp(num_tokens),
        )
        decision = policy.decide(view)
        rows = decision.rows
        decoding = rows_all[rows]
        step_blocks = blocks[rows]
        comp_model = self._layer_comp(num_tokens[rows])
        noise = self._noise()
        comp_true = comp_model * noise
        resident = decision.resident
        previously = np.array(
            [self.on_gpu.get(int(r), np.zeros(c.num_layers, np.bool_)) for r in decoding],
            dtype=np.bool_,
        ).reshape(len(decoding), c.num_layers)
        effective = resident & previously
        latency = self._latency(comp_true, step_blocks, effective)
        believed = policy_comp(policy, comp_model)
        predicted = latency
        if noise != 1.0 or not np.array_equal(believed, comp_model):
            predicted = self._latency(believed, step_blocks, effective)
        used = policy.gpu_blocks(step_blocks, resident) if len(decoding) else 0.0
        if used > c.gpu_block_budget:
            self._over += 1
        self._peak = max(self._peak, used)
        self._use_time += used * latency
        if policy.step_model == "double-buffered":
            fetched = int(step_blocks.sum()) * c.num_layers
        else:
            fetched = int((step_blocks[:, None] * ~effective).sum())
        self._fetched += fetched
        self.now_s += latency
        self._decode_s += latency
        stall = max(latency - float(comp_true.sum()), 0.0)
        self._stall_s += stall
        # Paused requests' KV leaves the GPU; decoding ones keep the plan's.
        for r in rows_all.tolist():
            self.on_gpu.pop(r, None)
        for i, r in enumerate(decoding.tolist()):
            self.on_gpu[r] = resident[i].copy()
        done: list[int] = []
        for r in decoding.tolist():
            self._token(r)
            if self.generated[r] >= self.output[r]:
                done.append(r)
        for r in done:
            self._finish(r)
        if done:
            gone = set(done)
            self.running = [r for r in self.running if r not in gone]
        ratio = np.full(c.num_layers, noise)
        policy.observe(self._steps, latency, predicted, ratio)
        self._steps += 1
        self._sample(latency, stall, used, prefill_tokens=0, decode_tokens=len(decoding))

    def _layer_comp(self, num_tokens: IntArray) -> FloatArray:
        """Per-layer compute of a decode iteration over these requests."""
        c = self.config
        if num_tokens.size == 0:
            return np.zeros(c.num_layers)
        total = self.cost.iteration_time_s(0, int(num_tokens.size), int((num_tokens + 1).sum()))
        return np.full(c.num_layers, total / c.num_layers)

    def _latency(self, comp: FloatArray, blocks: IntArray, resident: BoolArray) -> float:
        c = self.config
        if blocks.size == 0:
            return 0.0
        if self.policy.step_model == "double-buffered":
            return double_buffered_step_s(comp, float(blocks.sum()), c.link_blocks_per_s)
        if resident.all():
            return float(comp.sum())
        return step_latency_s(StepInputs.of(comp, blocks, resident, c.link_blocks_per_s))

    def _sample(
        self,
        iteration_s: float,
        stall_s: float,
        used: float,
        *,
        prefill_tokens: int,
        decode_tokens: int,
    ) -> None:
        self.timeline.append(
            TimelineSample(
                time_s=self.now_s,
                iteration_s=iteration_s,
                stall_s=stall_s,
                gpu_kv_blocks_used=math.ceil(used),
                cpu_kv_blocks_used=0,
                running=len(self.running),
                waiting=len(self.waiting),
                rotary=0,
                prefill_tokens=prefill_tokens,
                decode_tokens=decode_tokens,
            )
        )

    def _result(self, wall_s: float) -> LongctxRun:
        c = self.config
        p = self.policy
        totals = ReplayTotals(
            iterations=self._steps + self._prefills,
            simulated_s=self.now_s,
            wall_s=wall_s,
            bytes_d2h=0,
            bytes_h2d=self._fetched * c.layer_block_bytes,
            stall_s=self._stall_s,
            preemptions=p.pauses,
            swap_outs=p.pauses,
            swap_ins=p.resumes,
            peak_gpu_kv_blocks=math.ceil(self._peak),
            gpu_kv_blocks_total=c.gpu_block_budget,
        )
        result = ReplayResult(
            policy=p.name, requests=self.outcomes, timeline=self.timeline, totals=totals
        )
        stats = LongctxStats(
            policy=p.name,
            decode_steps=self._steps,
            prefill_iterations=self._prefills,
            replans=p.replans,
            replan_reasons=dict(sorted(p.reasons.items())),
            pauses=p.pauses,
            resumes=p.resumes,
            rejected=self.rejected,
            plan_wall_s=p.plan_wall_s,
            run_wall_s=wall_s,
            solver_time_share=p.plan_wall_s / wall_s if wall_s > 0 else None,
            peak_gpu_blocks=self._peak,
            gpu_block_budget=c.gpu_block_budget,
            mean_gpu_use=(
                self._use_time / self._decode_s / c.gpu_block_budget if self._decode_s > 0 else None
            ),
            over_budget_steps=self._over,
            fetched_blocks=self._fetched,
            decode_s=self._decode_s,
            prefill_s=self._prefill_s,
            stall_s=self._stall_s,
            plan_sources=dict(sorted(getattr(p, "plan_sources", {}).items())),
            solves=p.solve_tally.summary(),
        )
        return LongctxRun(result, stats)


def policy_comp(policy: LongctxPolicy, comp: FloatArray) -> FloatArray:
    """The per-layer compute the policy believes (its calibration applied)."""
    controller = getattr(policy, "controller", None)
    if controller is None:
        return comp
    calibrated: FloatArray = comp * np.asarray(controller.comp_s, dtype=np.float64)
    return calibrated
