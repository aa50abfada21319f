"""Layer offload as the batching core's KV-residency strategy (DESIGN.md
§3.2, §4; OrbitFlow), and the admission that goes with it.

- **Blocks** are one layer's KV blocks (planner.domain.offload): a request
  holding n KV tokens has ceil(n / block_size) blocks in every layer. The
  GPU budget and the link bandwidth are counted in them.
- **Admission** (FinalLengthAdmission, the core's scheduler): FCFS, no
  skipping, the head of the queue joins while fewer than ``max_running``
  requests run (paused ones count) and the policy can place the running
  requests and it at their *final* length (prompt + output tokens) with its
  most offloading option (``LongctxPolicy.fits``): the engine reserves for
  the whole length, like a scheduler that knows output lengths, so no
  request is ever preempted for memory. A request the policy cannot place
  even alone is rejected on arrival (LayerResidency.never_fits).
- **Decode step** (LayerResidency): the policy decides who decodes (paused
  requests don't) and which layers of each stay on GPU. Per-layer compute is
  the cost model's time of the decode batch split evenly over the L layers.
  The step's latency is the exact event model
  (planner.policies.offload.event_model) of those blocks and resident
  layers, or DeepSpeed's double-buffered pipeline
  (longctx_policies.double_buffered_step_s). A layer a plan newly keeps on
  GPU is fetched once, in the first step of the plan (timed as offloaded
  then); a layer newly offloaded costs nothing (its CPU copy is kept by
  write-through); a paused request's KV leaves the GPU (a resumed one
  fetches its resident layers once). A prefill computes every layer's KV on
  the GPU; offloaded layers' KV is written to CPU as it goes (hidden, not
  timed).
- **Output path**: OrbitFlow's tokens go through Token-Deposit (released one
  per TBT SLO while the deposit holds tokens; the rest flushed at finish);
  the user-visible release times are the token times the metrics see. The
  baselines' tokens are seen when emitted.
- **Noise** (``jitter_cv``): each iteration's compute is multiplied by a
  seeded lognormal factor of mean 1; OrbitFlow's controller sees the ratio
  observed / profiled per layer and re-plans on a mismatch.

Memory never exceeds the budget by construction; every decode step checks
it (``over_budget_steps`` counts violations, which would be a bug).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from planner.policies.offload import StepInputs, TokenDeposit
from planner.policies.offload.deposit import DepositEvents
from planner.policies.offload.event_model import step_latency_s
from planner.replay.batch import Batch
from planner.replay.engine_state import FINISHED, EngineState
from planner.replay.kv_residency import ResidentIteration
from planner.replay.longctx_policies import (
    BoolArray,
    FloatArray,
    IntArray,
    LongctxPolicy,
    StepView,
    double_buffered_step_s,
)
from planner.replay.models import AttentionPairsCost
from planner.replay.schedulers import EngineView, SchedulePlan


class FinalLengthAdmission:
    """The core's scheduler for layer offload: admits the queue's head while
    the policy can place the running requests and the admitted ones at their
    final length (see the module doc); never preempts."""

    swaps = False
    keeps_cpu_copies = False
    in_order = True
    idle_unless_waiting = True
    copies_only_unless_waiting = False
    running_first = False
    starts_queue_only = True

    def __init__(self, policy: LongctxPolicy, final_blocks: IntArray) -> None:
        self.name = policy.name
        self._policy = policy
        self._final_blocks = final_blocks

    def plan(self, view: EngineView) -> SchedulePlan:
        slots = view.free_slots if view.free_slots is not None else len(view.queued)
        taken = view.running.tolist()
        admitted: list[int] = []
        for head in view.queued.tolist():
            if len(admitted) >= slots:
                break
            if not self._policy.fits(self._final_blocks[[*taken, head]]):
                break
            taken.append(head)
            admitted.append(head)
        return SchedulePlan(start=np.array(admitted, dtype=np.int64))


class LayerResidency:
    """Per-layer KV residency of a LongctxPolicy (kv_residency.KvResidency):
    its decision before each decode step, the step timed by the event model,
    Token-Deposit on the output path, and the run's offload counters."""

    def __init__(
        self,
        policy: LongctxPolicy,
        cost: AttentionPairsCost,
        ids: Sequence[str],
        *,
        num_layers: int,
        gpu_block_budget: int,
        link_blocks_per_s: float,
        layer_block_bytes: int,
        block_size_tokens: int,
        jitter_cv: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.policy = policy
        self._cost = cost
        # Each request's row (in the core's columns) by its id.
        self._row_of = {request_id: row for row, request_id in enumerate(ids)}
        self._layers = num_layers
        self._budget = gpu_block_budget
        self._link = link_blocks_per_s
        self._layer_block_bytes = layer_block_bytes
        self._block_size = block_size_tokens
        self.deposit = TokenDeposit() if policy.uses_deposit else None
        # With a deposit, the times the user sees each request's tokens.
        self.released: list[list[float]] = [[] for _ in ids]
        self._on_gpu = np.zeros((len(ids), num_layers), dtype=np.bool_)
        # The observed / profiled compute per layer of a step without noise.
        self._exact: FloatArray = np.ones(num_layers)
        self._rng = np.random.default_rng(seed)
        sigma2 = math.log1p(jitter_cv**2)
        self._jitter = jitter_cv != 0.0
        self._sigma = math.sqrt(sigma2)
        self._mu = -sigma2 / 2
        # The step being formed: the decision's rows (of running) and plan.
        self._decoding: IntArray = np.zeros(0, dtype=np.int64)
        self._running: IntArray = np.zeros(0, dtype=np.int64)
        self._blocks: IntArray = np.zeros(0, dtype=np.int64)
        self._resident: BoolArray = np.zeros((0, num_layers), dtype=np.bool_)
        self._observed: tuple[float, float, FloatArray] | None = None
        self.steps = 0
        self.prefills = 0
        self.decode_s = 0.0
        self.prefill_s = 0.0
        self.fetched_blocks = 0
        self.peak_gpu_blocks = 0.0
        self.over_budget_steps = 0
        self._use_time = 0.0

    def never_fits(self, final_blocks: IntArray) -> npt.NDArray[np.bool_]:
        """Which requests (of these final per-layer blocks) the policy cannot
        place even alone: rejected on arrival."""
        fits = self.policy.fits
        return np.array(
            [not fits(final_blocks[[row]]) for row in range(len(final_blocks))], dtype=np.bool_
        )

    def mean_gpu_use(self) -> float | None:
        """The decode steps' GPU use, time-weighted, as a share of the budget."""
        if self.decode_s <= 0:
            return None
        return self._use_time / self.decode_s / self._budget

    # -- the strategy ---------------------------------------------------------

    def paused(self, state: EngineState, now_s: float) -> IntArray:
        r = state.requests
        running = state.running.rows
        num_tokens = r.kv_tokens[running]
        # ceil((num_tokens + 1) / block size): the KV after this step's token.
        blocks = (num_tokens + self._block_size) // self._block_size
        ids = tuple(r.id_array[running].tolist())
        deposits = (
            self.deposit.balance_array(ids)
            if self.deposit is not None
            else np.zeros(len(ids), dtype=np.int64)
        )
        view = StepView(
            step=self.steps,
            ids=ids,
            num_tokens=num_tokens,
            blocks=blocks,
            deposited_tokens=deposits,
            slo_tbt_s=r.slo_tbt_s[running],
            comp_s=self._layer_comp(num_tokens),
        )
        decision = self.policy.decide(view)
        self._running = running
        self._decoding = running[decision.rows]
        self._blocks = blocks[decision.rows]
        self._resident = decision.resident
        if len(decision.rows) == len(running):
            return running[:0]
        return np.delete(running, decision.rows)

    def timed(self, batch: Batch, compute_s: float) -> ResidentIteration:
        noise = self._noise()
        if batch.prefill_tokens:
            seconds = compute_s * noise
            self.prefill_s += seconds
            self.prefills += 1
            return ResidentIteration(seconds, 0.0, 0, 0)
        policy = self.policy
        decoding, blocks, resident = self._decoding, self._blocks, self._resident
        comp_model = (
            np.full(self._layers, compute_s / self._layers)
            if len(decoding)
            else np.zeros(self._layers)
        )
        comp_true = comp_model if noise == 1.0 else comp_model * noise
        effective = resident & self._on_gpu[decoding]
        latency = self._latency(comp_true, blocks, effective)
        believed = policy_comp(policy, comp_model)
        predicted = latency
        if noise != 1.0 or (
            believed is not comp_model and not np.array_equal(believed, comp_model)
        ):
            predicted = self._latency(believed, blocks, effective)
        used = policy.gpu_blocks(blocks, resident) if len(decoding) else 0.0
        if used > self._budget:
            self.over_budget_steps += 1
        self.peak_gpu_blocks = max(self.peak_gpu_blocks, used)
        self._use_time += used * latency
        if policy.step_model == "double-buffered":
            fetched = int(blocks.sum()) * self._layers
        else:
            fetched = int((blocks[:, None] * ~effective).sum())
        self.fetched_blocks += fetched
        self.decode_s += latency
        stall = max(latency - float(comp_true.sum()), 0.0)
        # Paused requests' KV leaves the GPU; decoding ones keep the plan's.
        if len(decoding) < len(self._running):
            self._on_gpu[self._running] = False
        self._on_gpu[decoding] = resident
        ratio = self._exact if noise == 1.0 else np.full(self._layers, noise)
        self._observed = (latency, predicted, ratio)
        return ResidentIteration(latency, stall, math.ceil(used), fetched * self._layer_block_bytes)

    def emitted(self, state: EngineState, batch: Batch, now_s: float) -> None:
        r = state.requests
        emitting = batch.emitting
        deposit = self.deposit
        if deposit is not None:
            for row, request_id, generated in zip(
                emitting.tolist(),
                r.id_array[emitting].tolist(),
                r.generated[emitting].tolist(),
                strict=True,
            ):
                if generated == 1:
                    self.released[row].append(now_s)
                    deposit.open(request_id, now_s, float(r.slo_tbt_s[row]))
                else:
                    self._release(deposit.deposit(request_id, now_s))
        for row in emitting[r.phase[emitting] == FINISHED].tolist():
            request_id = r.ids[row]
            if deposit is not None:
                self._release(deposit.finish(request_id, now_s))
            self.policy.finish_request(request_id)
        if batch.prefill_tokens:
            # The prefill computed every layer's KV on the GPU.
            self._on_gpu[emitting] = True
        if self._observed is not None:
            latency, predicted, ratio = self._observed
            self._observed = None
            self.policy.observe(self.steps, latency, predicted, ratio)
            self.steps += 1

    def end(self, now_s: float) -> None:
        """The run ended at now_s: the deposits release what is due."""
        if self.deposit is not None:
            self._release(self.deposit.advance(now_s))

    def token_times(self) -> Sequence[list[float]] | None:
        """The times the user saw each request's tokens, when a deposit held
        them back (else the emission times are those)."""
        return self.released if self.deposit is not None else None

    # -- helpers --------------------------------------------------------------

    def _noise(self) -> float:
        if not self._jitter:
            return 1.0
        return float(self._rng.lognormal(self._mu, self._sigma))

    def _release(self, events: DepositEvents) -> None:
        row_of = self._row_of
        for release in events.releases:
            self.released[row_of[release.request_id]].append(release.released_s)

    def _layer_comp(self, num_tokens: IntArray) -> FloatArray:
        """Per-layer compute of a decode iteration over these requests."""
        if num_tokens.size == 0:
            return np.zeros(self._layers)
        total = self._cost.iteration_time_s(0, int(num_tokens.size), int((num_tokens + 1).sum()))
        return np.full(self._layers, total / self._layers)

    def _latency(self, comp: FloatArray, blocks: IntArray, resident: BoolArray) -> float:
        if blocks.size == 0:
            return 0.0
        if self.policy.step_model == "double-buffered":
            return double_buffered_step_s(comp, float(blocks.sum()), self._link)
        if resident.all():
            return float(comp.sum())
        return step_latency_s(StepInputs.of(comp, blocks, resident, self._link))


def policy_comp(policy: LongctxPolicy, comp: FloatArray) -> FloatArray:
    """The per-layer compute the policy believes (its calibration applied)."""
    controller = getattr(policy, "controller", None)
    if controller is None:
        return comp
    calibrated: FloatArray = comp * np.asarray(controller.comp_s, dtype=np.float64)
    return calibrated
