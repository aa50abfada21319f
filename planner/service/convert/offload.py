"""OffloadService messages <-> the layer-offload policy's inputs and plan."""

from __future__ import annotations

import math

import numpy as np

from planner.domain.offload import DecodeBatch, OffloadInputs, OffloadParams, OffloadPlan
from planner.profiles import IterationCostModel, ProfileError
from planner.service.convert.checks import at_most, finite, non_negative, positive
from planner.service.convert.common import (
    MAX_SLO_S,
    hardware_from_proto,
    model_from_proto,
    slo_from_proto,
)
from planner.service.convert.solver import (
    PROTO_BACKENDS,
    backend_from_proto,
    plan_solve_to_proto,
    relative_gap_from_proto,
    time_limit_from_proto,
)
from planner.service.errors import InvalidArgumentError
from planner.service.limits import ServiceLimits
from planner.solvers import Backend
from planner.v1 import offload_pb2, solver_pb2

MAX_LAYERS = 1024
MAX_WINDOW_STEPS = 65_536
MAX_TOKENS = 1 << 40
# With MAX_SLO_S, keeps SLO x bandwidth (blocks per step) inside int64.
MAX_BLOCKS_PER_S = 1e12
DEFAULT_TIME_LIMIT_S = 0.05
# Left of the caller's deadline for converting the plan and answering.
DEADLINE_MARGIN_S = 0.002

_SEARCH = {
    offload_pb2.OFFLOAD_SEARCH_SPACE_UNSPECIFIED: "pruned",
    offload_pb2.OFFLOAD_SEARCH_SPACE_DISTANCE_PRUNED: "pruned",
    offload_pb2.OFFLOAD_SEARCH_SPACE_UNPRUNED: "periodic",
}


def batch_from_proto(
    msg: offload_pb2.PlanLayerOffloadRequest, default_tbt_s: float, limits: ServiceLimits
) -> DecodeBatch:
    reqs = msg.requests
    if len(reqs) > limits.max_requests_per_snapshot:
        raise InvalidArgumentError(
            "requests", f"at most {limits.max_requests_per_snapshot} requests, got {len(reqs)}"
        )
    seen: set[str] = set()
    for i, r in enumerate(reqs):
        field = f"requests[{i}]"
        if not r.id:
            raise InvalidArgumentError(f"{field}.id", "must not be empty")
        if r.id in seen:
            raise InvalidArgumentError(f"{field}.id", f"duplicate request id {r.id!r}")
        seen.add(r.id)
        if not 1 <= r.num_tokens <= MAX_TOKENS:
            raise InvalidArgumentError(
                f"{field}.num_tokens", f"must be in [1, {MAX_TOKENS}], got {r.num_tokens}"
            )
        if not 0 <= r.deposited_tokens <= MAX_TOKENS:
            raise InvalidArgumentError(
                f"{field}.deposited_tokens", f"must be >= 0, got {r.deposited_tokens}"
            )
        at_most(f"{field}.slo_tbt_s", non_negative(f"{field}.slo_tbt_s", r.slo_tbt_s), MAX_SLO_S)
        if r.remaining_tokens < 0:
            raise InvalidArgumentError(
                f"{field}.remaining_tokens", f"must be >= 0, got {r.remaining_tokens}"
            )
    n = len(reqs)
    slo = np.fromiter((r.slo_tbt_s for r in reqs), np.float64, n)
    remaining = np.fromiter((r.remaining_tokens for r in reqs), np.int64, n)
    return DecodeBatch(
        ids=tuple(r.id for r in reqs),
        num_tokens=np.fromiter((r.num_tokens for r in reqs), np.int64, n),
        deposited_tokens=np.fromiter((r.deposited_tokens for r in reqs), np.int64, n),
        slo_tbt_s=np.where(slo > 0, slo, default_tbt_s),
        paused=np.fromiter((r.paused for r in reqs), np.bool_, n),
        steps_left=np.where(remaining > 0, remaining, -1),
    )


def params_from_proto(
    msg: offload_pb2.OffloadParams,
    solver: solver_pb2.SolverOptions,
    time_remaining_s: float | None,
) -> OffloadParams:
    d = OffloadParams()
    cap = (
        non_negative("params.violation_cap", msg.violation_cap)
        if msg.HasField("violation_cap")
        else d.violation_cap
    )
    lo = msg.min_window_steps if msg.HasField("min_window_steps") else d.min_window_steps
    hi = msg.max_window_steps if msg.HasField("max_window_steps") else max(d.max_window_steps, lo)
    if not 1 <= lo <= MAX_WINDOW_STEPS:
        raise InvalidArgumentError(
            "params.min_window_steps", f"must be in [1, {MAX_WINDOW_STEPS}], got {lo}"
        )
    if not lo <= hi <= MAX_WINDOW_STEPS:
        raise InvalidArgumentError(
            "params.max_window_steps",
            f"must be in [min_window_steps={lo}, {MAX_WINDOW_STEPS}], got {hi}",
        )
    try:
        search = _SEARCH[msg.search_space]
    except KeyError:
        raise InvalidArgumentError(
            "params.search_space", f"unknown value {msg.search_space}"
        ) from None
    backend = backend_from_proto(
        "solver.backend", solver.backend, PROTO_BACKENDS, Backend.BRANCH_AND_BOUND
    )
    limit = time_limit_from_proto(solver, DEFAULT_TIME_LIMIT_S, time_remaining_s, DEADLINE_MARGIN_S)
    gap = relative_gap_from_proto(solver)
    return OffloadParams(
        violation_cap=cap,
        min_window_steps=lo,
        max_window_steps=hi,
        search_mode=search,
        time_limit_s=limit,
        backend=backend,
        relative_gap=gap,
    )


def inputs_from_proto(
    msg: offload_pb2.PlanLayerOffloadRequest,
    batch: DecodeBatch,
    params: OffloadParams,
) -> OffloadInputs:
    """Compute times, bandwidth and budget as given, or derived from the
    profile (required then)."""
    bs = msg.block_size_tokens or 16
    if not 1 <= bs <= 1 << 16:
        raise InvalidArgumentError("block_size_tokens", f"must be in [1, 65536], got {bs}")
    comp = np.array(msg.layer_compute_s, dtype=np.float64)
    if len(comp) > MAX_LAYERS:
        raise InvalidArgumentError("layer_compute_s", f"at most {MAX_LAYERS} layers")
    for i, c in enumerate(comp.tolist()):
        non_negative(f"layer_compute_s[{i}]", c)
    bandwidth = msg.link_blocks_per_s
    if bandwidth:
        at_most("link_blocks_per_s", positive("link_blocks_per_s", bandwidth), MAX_BLOCKS_PER_S)
    budget = msg.gpu_block_budget
    if budget < 0:
        raise InvalidArgumentError("gpu_block_budget", f"must be >= 0, got {budget}")
    if len(comp) == 0 or not bandwidth or not budget:
        model = model_from_proto("profile", msg.profile)
        hardware = hardware_from_proto("profile", msg.profile)
        missing = [
            name
            for name, given in (
                ("layer_compute_s", len(comp) > 0),
                ("link_blocks_per_s", bool(bandwidth)),
                ("gpu_block_budget", bool(budget)),
            )
            if not given
        ]
        if model is None or hardware is None:
            raise InvalidArgumentError(
                "profile",
                f"model and hardware are needed to derive {', '.join(missing)} (or give them)",
            )
        try:
            cost = IterationCostModel.derive(model, hardware)
        except ProfileError as exc:
            raise InvalidArgumentError("profile", str(exc)) from None
        layer_block_bytes = cost.block_bytes_per_gpu(bs) / model.num_layers
        if len(comp) == 0:
            step_s = cost.iteration_time_s(0, len(batch), int(batch.num_tokens.sum()))
            comp = np.full(model.num_layers, step_s / model.num_layers)
        if not bandwidth:
            bandwidth = hardware.h2d_gbps * 1e9 / layer_block_bytes
        if not budget:
            budget = cost.kv_blocks(bs) * model.num_layers
    if not math.isfinite(float(comp.sum())):
        raise InvalidArgumentError("layer_compute_s", "must be finite")
    link = float(finite("link_blocks_per_s", bandwidth))
    if float(comp.sum()) * link > MAX_TOKENS:
        raise InvalidArgumentError(
            "layer_compute_s",
            f"a step of {float(comp.sum())} s at {link} blocks/s moves more than "
            f"{MAX_TOKENS} blocks (times in seconds, bandwidth in blocks per second?)",
        )
    return OffloadInputs(
        layer_compute_s=comp,
        link_blocks_per_s=link,
        gpu_block_budget=int(budget),
        block_size_tokens=bs,
        params=params,
    )


def offload_request_from_proto(
    msg: offload_pb2.PlanLayerOffloadRequest,
    limits: ServiceLimits,
    time_remaining_s: float | None,
) -> tuple[DecodeBatch, OffloadInputs]:
    slo = slo_from_proto("slo", msg.slo)
    batch = batch_from_proto(msg, slo.tbt_s, limits)
    params = params_from_proto(msg.params, msg.solver, time_remaining_s)
    return batch, inputs_from_proto(msg, batch, params)


def offload_plan_to_proto(plan: OffloadPlan) -> offload_pb2.PlanLayerOffloadResponse:
    out = offload_pb2.OffloadPlan(
        placements=[
            offload_pb2.LayerPlacement(
                id=p.id,
                distance=p.distance,
                offloaded_layers=p.offloaded_layers,
                blocks_per_layer=p.blocks_per_layer,
                gpu_blocks=p.gpu_blocks,
                fetched_blocks_per_step=p.fetched_blocks_per_step,
            )
            for p in plan.placements
        ],
        paused_ids=plan.paused_ids,
        newly_paused_ids=plan.newly_paused_ids,
        resumed_ids=plan.resumed_ids,
        prefetch_buffer_blocks=plan.prefetch_buffer_blocks,
        gpu_blocks_used=plan.gpu_blocks_used,
        gpu_blocks_used_at_expiry=plan.gpu_blocks_used_at_expiry,
        gpu_block_budget=plan.gpu_block_budget,
        predicted_step_s=plan.predicted_step_s,
        predicted_step_surrogate_s=plan.predicted_step_surrogate_s,
        predicted_step_paper_s=plan.predicted_step_paper_s,
        window_steps=plan.window_steps,
        expiry_step=plan.expiry_step,
        violations_per_step=plan.violations_per_step,
        source=offload_pb2.OffloadPlanSource.ValueType(int(plan.source)),
        solves=plan.solves,
        solve_wall_s=plan.solve_wall_s,
        summary=plan.summary,
    )
    if plan.solve is not None:
        out.solve.CopyFrom(plan_solve_to_proto(plan.solve))
    return offload_pb2.PlanLayerOffloadResponse(plan=out)
