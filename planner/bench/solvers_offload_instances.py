"""Seeded synthetic decode batches for `planner bench solvers --problem offload`.

One instance is one long-context decode batch as the layer-offload planner
(planner/policies/offload) sees it: R requests of 8k-128k tokens (log-uniform),
16-token blocks, each request's TBT SLO 1.2-2x the step's compute, a few
deposited tokens, the remaining output unknown (as in replay). Per-layer
compute (one decode step of the batch, spread evenly over the layers), KV
block bytes per layer and the host link come from built-in profiles on an
A100-SXM-80GB (PCIe Gen4 x16, 25 GB/s host-to-device):

- 32 layers: Llama-3-8B; 48: Qwen2.5-14B; 80: Llama-3-70B at tensor parallel
  4 (one GPU's shard: 2 KV heads, a quarter of the compute); another layer
  count takes the per-layer numbers of the nearest of these.

The GPU block budget sets the memory pressure class. With "least" the least
budget with a feasible plan (bisection with the branch and bound between
the least memory any plan needs, every request offloading every other layer,
and the whole KV; the SLO rows usually bind before memory does):

- fits: >= the whole KV (nothing needs offloading at the shortest window);
- moderate: 30-80% of the way from least to the whole KV;
- tight: within 5% of that range above least (barely feasible);
- infeasible: 0.5-5% below least (no plan holds, by memory or SLO).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from planner.domain.offload import DecodeBatch, OffloadInputs, OffloadParams
from planner.policies.offload.greedy import greedy_choice
from planner.policies.offload.ilp import OffloadIlp, WindowOption, build_offload_ilp
from planner.policies.offload.placement import end_blocks, window_options
from planner.policies.offload.problem import OffloadProblem, offload_problem
from planner.policies.offload.search import branch_and_bound
from planner.policies.offload.search_space import (
    OffloadCandidates,
    SearchMode,
    candidate_patterns,
)
from planner.profiles.cost import IterationCostModel
from planner.profiles.hardware import find_hardware
from planner.profiles.models import find_model
from planner.solvers import Status

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

PRESSURES = ("fits", "moderate", "tight", "infeasible")
HARDWARE = "a100-sxm-80gb"
# layers -> (model, tensor parallel)
MODELS = {32: ("llama-3-8b", 1), 48: ("qwen2.5-14b", 1), 80: ("llama-3-70b", 4)}
BLOCK_SIZE_TOKENS = 16
MIN_TOKENS, MAX_TOKENS = 8 * 1024, 128 * 1024


@dataclass(frozen=True, slots=True)
class Setting:
    """Per-layer numbers of one profile, for any number of layers."""

    model: str
    tensor_parallel: int
    hardware: str
    layer_block_bytes: int
    link_blocks_per_s: float
    cost: IterationCostModel

    def layer_compute_s(self, num_tokens: IntArray, num_layers: int) -> FloatArray:
        """One decode step of these requests, per layer of the profile's model."""
        step = self.cost.iteration_time_s(0, int(num_tokens.size), int((num_tokens + 1).sum()))
        return np.full(num_layers, step / self.cost.model.num_layers)

    def describe(self) -> str:
        tp = f" TP{self.tensor_parallel}" if self.tensor_parallel > 1 else ""
        return (
            f"{self.model}{tp}@{self.hardware}: {self.layer_block_bytes // 1024} KiB per "
            f"layer block, {self.link_blocks_per_s:,.0f} blocks/s host-to-device"
        )


_SETTINGS: dict[int, Setting] = {}


def setting_for(num_layers: int) -> Setting:
    key = min(MODELS, key=lambda n: (abs(n - num_layers), n))
    if key not in _SETTINGS:
        name, tp = MODELS[key]
        model, hardware = find_model(name), find_hardware(HARDWARE)
        if model is None or hardware is None:
            raise RuntimeError(f"built-in profile {name}@{HARDWARE} missing")
        cost = IterationCostModel.derive(model, hardware, tp)
        block_bytes = cost.kv_bytes_per_token_per_gpu() // model.num_layers * BLOCK_SIZE_TOKENS
        _SETTINGS[key] = Setting(
            model=name,
            tensor_parallel=tp,
            hardware=HARDWARE,
            layer_block_bytes=int(block_bytes),
            link_blocks_per_s=hardware.h2d_gbps * 1e9 / block_bytes,
            cost=cost,
        )
    return _SETTINGS[key]


@dataclass
class Instance:
    requests: int
    layers: int
    index: int
    seed: list[int]  # np.random.default_rng(seed) made it
    pressure: str
    comp_s: FloatArray
    link_blocks_per_s: float
    budget: int
    blocks: IntArray  # blocks per layer now
    windows: list[WindowOption]
    candidates: OffloadCandidates
    problem: OffloadProblem
    greedy: IntArray | None
    _ilp: OffloadIlp | None = field(default=None, repr=False)
    ilp_build_s: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.requests}x{self.layers}#{self.index} seed={self.seed} {self.pressure}"

    @property
    def step_compute_s(self) -> float:
        return float(self.comp_s.sum())

    def ilp(self) -> OffloadIlp:
        """The model for the general backends (built once, build time kept)."""
        if self._ilp is None:
            started = time.perf_counter()
            self._ilp = build_offload_ilp(
                self.comp_s,
                self.link_blocks_per_s,
                self.budget,
                self.blocks,
                self.candidates,
                windows=self.windows,
            )
            self.ilp_build_s = time.perf_counter() - started
        return self._ilp

    def hint(self) -> FloatArray | None:
        """The greedy plan as values of the ILP's choice variables (what the
        planner hints without a previous plan)."""
        if self.greedy is None:
            return None
        ilp = self.ilp()
        values = np.full(ilp.model.num_vars, np.nan)
        values[ilp.choice.ravel()] = 0.0
        values[ilp.choice[np.arange(self.requests), self.greedy]] = 1.0
        return values

    def problem_in(self, mode: SearchMode | str) -> tuple[OffloadProblem, OffloadCandidates]:
        candidates = candidate_patterns(self.layers, mode)
        problem = offload_problem(
            self.comp_s,
            self.link_blocks_per_s,
            self.budget,
            self.blocks,
            candidates,
            windows=self.windows,
        )
        return problem, candidates


def make_instance(requests: int, layers: int, index: int, seed: int) -> Instance:
    """Instance `index` of this size; its pressure class is PRESSURES[index % 4]."""
    pressure = PRESSURES[index % len(PRESSURES)]
    rng_seed = [seed, requests, layers, index]
    rng = np.random.default_rng(rng_seed)
    setting = setting_for(layers)
    num_tokens = np.exp(rng.uniform(math.log(MIN_TOKENS), math.log(MAX_TOKENS), requests)).astype(
        np.int64
    )
    comp = setting.layer_compute_s(num_tokens, layers)
    batch = DecodeBatch(
        ids=tuple(f"r{i}" for i in range(requests)),
        num_tokens=num_tokens,
        deposited_tokens=rng.integers(0, 33, requests).astype(np.int64),
        slo_tbt_s=rng.uniform(1.2, 2.0, requests) * float(comp.sum()),
        paused=np.zeros(requests, dtype=np.bool_),
        steps_left=np.full(requests, -1, dtype=np.int64),
    )
    candidates = candidate_patterns(layers, SearchMode.PRUNED)
    link = setting.link_blocks_per_s
    # Window options do not depend on the budget.
    probe = OffloadInputs(comp, link, 0, BLOCK_SIZE_TOKENS, OffloadParams())
    windows = window_options(batch, probe)
    blocks = end_blocks(batch, 0, BLOCK_SIZE_TOKENS)
    end = windows[0].end_blocks
    whole = layers * int(end.sum())
    free = offload_problem(comp, link, 0, blocks, candidates, windows=windows)
    least = _least_feasible_budget(free, whole)
    span = whole - least
    match pressure:
        case "fits":
            budget = whole + int(whole * rng.uniform(0.0, 0.1))
        case "moderate":
            budget = least + int(span * rng.uniform(0.3, 0.8))
        case "tight":
            budget = least + int(span * rng.uniform(0.0, 0.05))
        case _:
            budget = least - max(1, int(least * rng.uniform(0.005, 0.05)))
    problem = replace(free, mem_cap=free.mem_cap + budget)
    greedy = greedy_choice(end, candidates, budget)
    return Instance(
        requests=requests,
        layers=layers,
        index=index,
        seed=rng_seed,
        pressure=pressure,
        comp_s=comp,
        link_blocks_per_s=link,
        budget=budget,
        blocks=blocks,
        windows=windows,
        candidates=candidates,
        problem=problem,
        greedy=greedy,
    )


# Bisection of the least feasible budget: steps, and each feasibility check's
# budget: nodes (the same answer on any machine), with a generous clock limit
# as a backstop only.
BISECTION_STEPS = 14
FEASIBILITY_NODES = 2000
FEASIBILITY_LIMIT_S = 30.0


def _feasible(free: OffloadProblem, budget: int) -> bool:
    """Some plan holds with this budget (the first plan found is enough:
    relative_gap 1 prunes every node once there is one)."""
    problem = replace(free, mem_cap=free.mem_cap + budget)
    found = branch_and_bound(
        problem,
        time_limit_s=FEASIBILITY_LIMIT_S,
        relative_gap=1.0,
        node_limit=FEASIBILITY_NODES,
    )
    return found.status in (Status.OPTIMAL, Status.FEASIBLE)


def _least_feasible_budget(free: OffloadProblem, whole: int) -> int:
    """About the least GPU block budget with a feasible plan (memory and SLO
    rows of the shortest window): bisection between a bound no plan beats
    and the whole KV (feasible: nothing offloaded fits, and then nothing
    stalls), to 1/2^BISECTION_STEPS of that range."""
    rows = np.arange(free.num_requests)
    last = np.full(free.num_requests, free.num_choices - 1, dtype=np.int64)
    memory = -int(free.mem_cap[0]) + int(free.mem_coef[0, rows, last].sum())
    memory += int(free.evaluate(last).buffer[0])  # every layer it offloads: all requests' blocks
    lo, hi = min(memory, whole) - 1, whole  # lo infeasible (by memory), hi feasible
    for _ in range(BISECTION_STEPS):
        if hi - lo <= 1:
            break
        mid = (lo + hi) // 2
        if _feasible(free, mid):
            hi = mid
        else:
            lo = mid
    return hi
