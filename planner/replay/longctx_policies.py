"""Layer-offload policies of the long-context replay topology (DESIGN.md
§3.2; OrbitFlow §5.1 "Baselines"): which layers of each running request's KV
stay on the GPU at each decode step.

- ``orbitflow``: the adaptive controller decides when to re-plan (no plan,
  batch change, plan expiry, profile mismatch) and ``plan_layer_offload``
  places the batch, Pause-Resume included. Token-Deposit on the output path is
  the engine's (``uses_deposit``).
- ``deepspeed`` (DeepSpeed-Inference): "offloads all KV caches to the CPU and
  retains only the current layer's KV cache in GPU ... prefetching the next
  layer's KV cache during the current layer's execution". No layer stays on
  the GPU between steps: every step fetches all L layers of every request,
  double-buffered (the layer being computed and the next one being fetched),
  so the step is timed by :func:`double_buffered_step_s`, not by the
  one-slot event model (under which nothing would overlap at all).
- ``flexgen``: one uniform offload pattern chosen once, offline, for the
  design point "max batch size requests of the trace's mean final length"
  (the fewest offloaded layers that fit it; the most offloading pruned
  pattern if none does); never reconfigured.
- ``flexgen+``: a uniform pattern for the whole batch, re-chosen when the
  batch changes (requests join or leave); also when the KV growth makes the
  installed pattern overflow the budget (counted as a re-plan, reason
  ``memory``). It picks the fewest offloaded layers that fit the batch grown
  by ``GROWTH_HORIZON_STEPS`` tokens.
- ``greedy`` (the paper's "Dynamic Heuristic"): ``greedy_choice`` every step;
  no Pause-Resume, no Token-Deposit.

A policy is a small stateful object per run: the engine calls
:meth:`decide` before every decode step and :meth:`observe` after it, and
:meth:`fits` to admit requests (the final-length KV of the batch plus the
newcomer must be placeable by the policy's most offloading option, see
longctx_engine). Planning wall time is measured here (``plan_wall_s``); the
simulated time never depends on it.
"""

from __future__ import annotations

import abc
import math
import time
from dataclasses import dataclass, field
from typing import Self

import numpy as np
import numpy.typing as npt

from planner.domain.offload import DecodeBatch, OffloadInputs, OffloadParams, OffloadPlan
from planner.policies.offload import (
    AdaptiveController,
    ControllerConfig,
    StepObservation,
    candidate_patterns,
    gpu_blocks_needed,
)
from planner.policies.offload.greedy import greedy_choice
from planner.policies.offload.placement import plan_layer_offload
from planner.replay.solve_tally import SolveTally

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

# flexgen+ sizes a new pattern for the batch grown by this many tokens each
# (OrbitFlow's longest decode window, 64 steps).
GROWTH_HORIZON_STEPS = 64


@dataclass(frozen=True, slots=True)
class StepView:
    """What a policy sees before decode step `step`: the running requests
    (paused ones included), as columns.

    num_tokens: KV tokens each request holds (prompt + generated - 1; the
        step writes one more). blocks: per-layer KV blocks the step works
        on, ceil((num_tokens + 1) / block_size). comp_s: the profile's
        per-layer compute time of a decode step of all the rows (paused ones
        included: who pauses is the policy's decision, so this is the upper
        bound the planner plans with)."""

    step: int
    ids: tuple[str, ...]
    num_tokens: IntArray
    blocks: IntArray
    deposited_tokens: IntArray
    slo_tbt_s: FloatArray
    comp_s: FloatArray


@dataclass(frozen=True, slots=True)
class Decision:
    """rows: the rows of the view that decode this step (the others are
    paused); resident: (len(rows), L) True where the layer stays on GPU."""

    rows: IntArray
    resident: BoolArray
    replanned: bool
    reasons: tuple[str, ...] = ()
    newly_paused: int = 0
    resumed: int = 0
    predicted_step_s: float | None = None


@dataclass(frozen=True, slots=True)
class OffloadSetup:
    """The engine facts a policy plans with (per-layer blocks)."""

    num_layers: int
    block_size_tokens: int
    gpu_block_budget: int
    link_blocks_per_s: float
    max_running: int
    params: OffloadParams = field(default_factory=OffloadParams)
    controller: ControllerConfig = field(default_factory=ControllerConfig)


class LongctxPolicy(abc.ABC):
    """Base: counters and the admission check."""

    name = "base"
    uses_deposit = False
    # Step timing: "event" (the exact one-slot event model) or
    # "double-buffered" (DeepSpeed's all-layers prefetch pipeline).
    step_model = "event"

    def __init__(self, setup: OffloadSetup) -> None:
        self.setup = setup
        self.candidates = candidate_patterns(setup.num_layers)
        self.replans = 0
        self.pauses = 0
        self.resumes = 0
        self.plan_wall_s = 0.0
        self.reasons: dict[str, int] = {}
        # The deciding solve of each plan (policies that solve: orbitflow).
        self.solve_tally = SolveTally()

    @classmethod
    def for_run(cls, setup: OffloadSetup, *, design_tokens: int) -> Self:
        """A fresh policy for one run (what planner.replay.longctx_registry
        registers); design_tokens: the trace's mean final length."""
        return cls(setup)

    # The pattern admission plans for: the most offloading pruned pattern.
    def admission_resident(self) -> BoolArray:
        resident: BoolArray = self.candidates.resident[-1]
        return resident

    def gpu_blocks(self, blocks: IntArray, resident: BoolArray) -> float:
        """GPU blocks the rows need under `resident` ((R, L) or one (L,)
        pattern for all)."""
        if resident.ndim == 1:
            resident = np.broadcast_to(resident, (blocks.shape[0], resident.shape[0]))
        return float(gpu_blocks_needed(blocks, resident))

    def fits(self, final_blocks: IntArray) -> bool:
        """Can this policy hold requests of these per-layer blocks at once?"""
        if final_blocks.size == 0:
            return True
        return self.gpu_blocks(final_blocks, self.admission_resident()) <= (
            self.setup.gpu_block_budget
        )

    @abc.abstractmethod
    def decide(self, view: StepView) -> Decision:
        """The placements (and pauses) for this decode step."""

    def observe(
        self,
        step: int,
        observed_s: float,
        predicted_s: float,
        comp_ratio: FloatArray,
    ) -> None:
        """After the step: its latency, the model's re-evaluated prediction
        and the observed / profiled compute ratio per layer. The baselines
        learn nothing from it (OrbitFlow's controller does)."""
        return None

    def finish_request(self, request_id: str) -> None:
        """The request left the batch (only OrbitFlow keeps per-request
        state)."""
        return None

    def _count(self, reasons: tuple[str, ...]) -> None:
        self.replans += 1
        for r in reasons:
            self.reasons[r] = self.reasons.get(r, 0) + 1


def _all_rows(n: int) -> IntArray:
    return np.arange(n, dtype=np.int64)


class DeepSpeed(LongctxPolicy):
    name = "deepspeed"
    step_model = "double-buffered"

    def admission_resident(self) -> BoolArray:
        return np.zeros(self.setup.num_layers, dtype=np.bool_)

    def gpu_blocks(self, blocks: IntArray, resident: BoolArray) -> float:
        # The layer being computed and the one being prefetched.
        return 2.0 * float(blocks.sum())

    def decide(self, view: StepView) -> Decision:
        n = len(view.ids)
        return Decision(
            rows=_all_rows(n),
            resident=np.zeros((n, self.setup.num_layers), dtype=np.bool_),
            replanned=False,
        )


def _uniform_fit(
    policy: LongctxPolicy, blocks: IntArray, *, fallback_last: bool = True
) -> int | None:
    """The candidate with the fewest offloaded layers that, used by every
    row, fits the budget; the most offloading one (or None) when none does."""
    budget = policy.setup.gpu_block_budget
    for c in range(len(policy.candidates)):
        if policy.gpu_blocks(blocks, policy.candidates.resident[c]) <= budget:
            return c
    return len(policy.candidates) - 1 if fallback_last else None


class FlexGen(LongctxPolicy):
    """Static uniform pattern for a design batch (see the module doc)."""

    name = "flexgen"

    def __init__(self, setup: OffloadSetup, design_tokens: int) -> None:
        super().__init__(setup)
        bs = setup.block_size_tokens
        design = np.full(setup.max_running, -(-max(design_tokens, 1) // bs), dtype=np.int64)
        started = time.perf_counter()
        choice = _uniform_fit(self, design)
        self.plan_wall_s += time.perf_counter() - started
        assert choice is not None
        self.choice = choice
        self.design_tokens = design_tokens
        self.replans = 1
        self.reasons = {"offline": 1}

    @classmethod
    def for_run(cls, setup: OffloadSetup, *, design_tokens: int) -> Self:
        return cls(setup, design_tokens)

    def admission_resident(self) -> BoolArray:
        resident: BoolArray = self.candidates.resident[self.choice]
        return resident

    def decide(self, view: StepView) -> Decision:
        n = len(view.ids)
        pattern = self.candidates.resident[self.choice]
        return Decision(
            rows=_all_rows(n),
            resident=np.broadcast_to(pattern, (n, pattern.shape[0])).copy(),
            replanned=False,
        )


class FlexGenPlus(LongctxPolicy):
    name = "flexgen+"

    def __init__(self, setup: OffloadSetup) -> None:
        super().__init__(setup)
        self.batch: tuple[str, ...] | None = None
        self.choice = 0

    def decide(self, view: StepView) -> Decision:
        n = len(view.ids)
        budget = self.setup.gpu_block_budget
        reasons: tuple[str, ...] = ()
        if self.batch is None:
            reasons = ("no_plan",)
        elif view.ids != self.batch:
            reasons = ("batch_change",)
        elif self.gpu_blocks(view.blocks, self.candidates.resident[self.choice]) > budget:
            reasons = ("memory",)
        if reasons:
            started = time.perf_counter()
            grown = -(-(view.num_tokens + GROWTH_HORIZON_STEPS) // self.setup.block_size_tokens)
            choice = _uniform_fit(self, grown.astype(np.int64), fallback_last=False)
            if choice is None:
                choice = _uniform_fit(self, view.blocks)
            assert choice is not None
            self.choice = choice
            self.batch = view.ids
            self.plan_wall_s += time.perf_counter() - started
            self._count(reasons)
        pattern = self.candidates.resident[self.choice]
        return Decision(
            rows=_all_rows(n),
            resident=np.broadcast_to(pattern, (n, pattern.shape[0])).copy(),
            replanned=bool(reasons),
            reasons=reasons,
        )


class Greedy(LongctxPolicy):
    name = "greedy"

    def decide(self, view: StepView) -> Decision:
        started = time.perf_counter()
        choice = greedy_choice(view.blocks, self.candidates, self.setup.gpu_block_budget)
        if choice is None:  # admission prevents it; the most offloading then
            choice = np.full(len(view.ids), len(self.candidates) - 1, dtype=np.int64)
        resident = self.candidates.resident[choice]
        self.plan_wall_s += time.perf_counter() - started
        self._count(("every_step",))
        return Decision(
            rows=_all_rows(len(view.ids)),
            resident=resident,
            replanned=True,
            reasons=("every_step",),
        )


class OrbitFlow(LongctxPolicy):
    """The adaptive controller and plan_layer_offload.

    The controller's ``comp_s`` holds a per-layer calibration factor (observed
    / profiled compute, 1 = the profile is exact), EWMA-updated on a profile
    mismatch; the planner is given the profile's per-layer compute of the
    current batch times that factor, and the controller's bandwidth."""

    name = "orbitflow"
    uses_deposit = True

    def __init__(self, setup: OffloadSetup) -> None:
        super().__init__(setup)
        self.controller = AdaptiveController(
            comp_s=[1.0] * setup.num_layers,
            bandwidth_blocks_per_s=setup.link_blocks_per_s,
            config=setup.controller,
        )
        self.plan: OffloadPlan | None = None
        self.resident_of: dict[str, BoolArray] = {}
        self.paused: set[str] = set()
        self._last: tuple[int, float, float, FloatArray] | None = None
        self.plan_sources: dict[str, int] = {}

    def observe(
        self, step: int, observed_s: float, predicted_s: float, comp_ratio: FloatArray
    ) -> None:
        self._last = (step, observed_s, predicted_s, comp_ratio)

    def finish_request(self, request_id: str) -> None:
        self.paused.discard(request_id)
        self.resident_of.pop(request_id, None)

    def _reasons(self, view: StepView) -> tuple[str, ...]:
        if self.plan is None or self._last is None:
            if self.plan is None:
                return ("no_plan",)
            # A plan but no step observed since (e.g. prefill in between).
            if frozenset(view.ids) != self.controller.plan_request_ids:
                return ("batch_change",)
            expiry = self.controller.plan_expiry_step
            return ("expiry",) if expiry is not None and view.step >= expiry else ()
        step, observed, predicted, ratio = self._last
        self._last = None
        decision = self.controller.observe(
            StepObservation(
                step=step,
                request_ids=view.ids,
                observed_step_s=observed,
                predicted_step_s=predicted,
                layer_comp_s=ratio.tolist(),
                bandwidth_blocks_per_s=self.setup.link_blocks_per_s,
            )
        )
        reasons = tuple(str(r) for r in decision.reasons)
        expiry = self.controller.plan_expiry_step
        if not reasons and expiry is not None and view.step >= expiry:
            reasons = ("expiry",)
        return reasons

    def decide(self, view: StepView) -> Decision:
        n = len(view.ids)
        reasons = self._reasons(view)
        if not reasons:
            # The plan holds unless the KV outgrew it (the planner checks the
            # window's end, so only after an unplanned growth).
            rows, resident = self._apply(view)
            if self.gpu_blocks(view.blocks[rows], resident) > self.setup.gpu_block_budget:
                reasons = ("memory",)
        newly_paused = resumed = 0
        if reasons:
            newly_paused, resumed = self._replan(view)
            self._count(reasons)
        rows, resident = self._apply(view)
        if rows.size == 0 and n:
            # Everyone paused: run the smallest one alone, most offloading
            # pattern (admission guarantees it fits); counted as a resume.
            smallest = int(np.argmin(view.blocks))
            request_id = view.ids[smallest]
            self.paused.discard(request_id)
            self.resident_of[request_id] = self.candidates.resident[-1].copy()
            resumed += 1
            rows, resident = self._apply(view)
        self.pauses += newly_paused
        self.resumes += resumed
        predicted = self.plan.predicted_step_s if self.plan is not None else None
        return Decision(
            rows=rows,
            resident=resident,
            replanned=bool(reasons),
            reasons=reasons,
            newly_paused=newly_paused,
            resumed=resumed,
            predicted_step_s=predicted,
        )

    def _apply(self, view: StepView) -> tuple[IntArray, BoolArray]:
        rows = [i for i, r in enumerate(view.ids) if r not in self.paused]
        most = self.candidates.resident[-1]
        resident = np.array(
            [self.resident_of.get(view.ids[i], most) for i in rows], dtype=np.bool_
        ).reshape(len(rows), self.setup.num_layers)
        return np.array(rows, dtype=np.int64), resident

    def _replan(self, view: StepView) -> tuple[int, int]:
        s = self.setup
        n = len(view.ids)
        calibration = np.asarray(self.controller.comp_s, dtype=np.float64)
        batch = DecodeBatch(
            ids=view.ids,
            num_tokens=view.num_tokens,
            deposited_tokens=view.deposited_tokens,
            slo_tbt_s=view.slo_tbt_s,
            paused=np.array([r in self.paused for r in view.ids], dtype=np.bool_),
            # The engine does not know how many tokens a request will produce.
            steps_left=np.full(n, -1, dtype=np.int64),
        )
        inputs = OffloadInputs(
            layer_compute_s=view.comp_s * calibration,
            link_blocks_per_s=self.controller.bandwidth_blocks_per_s,
            gpu_block_budget=s.gpu_block_budget,
            block_size_tokens=s.block_size_tokens,
            params=s.params,
        )
        started = time.perf_counter()
        plan = plan_layer_offload(batch, inputs, step=view.step, previous=self.plan)
        self.plan_wall_s += time.perf_counter() - started
        source = plan.source.name.lower()
        self.plan_sources[source] = self.plan_sources.get(source, 0) + 1
        if plan.solve is not None:
            self.solve_tally.add(plan.solve)
        self.plan = plan
        self.paused = set(plan.paused_ids)
        self.resident_of = {}
        for pl in plan.placements:
            mask = np.ones(s.num_layers, dtype=np.bool_)
            mask[list(pl.offloaded_layers)] = False
            self.resident_of[pl.id] = mask
        predicted = plan.predicted_step_s if math.isfinite(plan.predicted_step_s) else 0.0
        self.controller.install_plan(view.ids, predicted, plan.expiry_step)
        return len(plan.newly_paused_ids), len(plan.resumed_ids)


def double_buffered_step_s(comp_s: FloatArray, fetch_blocks: float, bandwidth: float) -> float:
    """A decode step that fetches every layer (fetch_blocks over the link per
    layer, all requests together, so one aggregate transfer of
    fetch_blocks / bandwidth seconds) with two layer buffers: layer l+1's
    fetch starts when layer l's fetch is done and layer l-1 has been computed
    (its buffer is free); layer l starts when layer l-1 is done and its KV is
    in."""
    num_layers = int(comp_s.shape[0])
    if num_layers == 0:
        return 0.0
    f = fetch_blocks / bandwidth
    fetch_done = f  # layer 0's KV is in
    end_prev = 0.0  # end of layer l-1 (0 before layer 0)
    for c in comp_s.tolist():
        start = max(end_prev, fetch_done)
        # Layer l+1's buffer is layer l-1's: free once l-1 is computed; the
        # link moves one layer at a time.
        fetch_done = max(fetch_done, end_prev) + f
        end_prev = start + c
    return end_prev
