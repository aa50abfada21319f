"""ServerlessService messages <-> serverless domain types, with validation
that names the field (INVALID_ARGUMENT)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from planner.domain.serverless import (
    ChunkChoice,
    KernelChoice,
    MigSlice,
    PlacementParams,
    PlacementPlan,
    PreemptionParams,
    RouteDecision,
    ScheduledRoute,
    ServerlessModel,
    SliceState,
    WaitingModel,
)
from planner.policies.serverless.routing import check_slices
from planner.policies.serverless.tuner import KnobDecision, TunerParams, TunerState
from planner.profiles import MODEL_PROFILES, ModelProfile, find_model
from planner.profiles.c2c_cost import ChunkRow
from planner.profiles.mig import GH200_C2C_LINK, MIG_PROFILES, MigSliceProfile, find_mig_profile
from planner.service.convert.checks import finite, non_negative, positive
from planner.service.convert.solver import (
    model_solver_from_proto,
    plan_solve_to_proto,
    time_limit_from_proto,
)
from planner.service.errors import InvalidArgumentError
from planner.service.limits import MAX_ID_LENGTH
from planner.v1 import serverless_pb2

MAX_MODELS = 10_000
MAX_SLICES = 64
MAX_MODELS_PER_SLICE = 16
MAX_CHUNK_ROWS = 1024
MAX_TOKENS = 1 << 24
DEFAULT_TIME_LIMIT_S = 0.2
DEADLINE_MARGIN_S = 0.002
DEFAULT_UTILIZATION_CAP = 0.9
# Bounds that keep the placement's link-demand coefficients (bytes / tpot)
# in the range the solver's integer scaling represents exactly; each is far
# beyond any real model or link.
MIN_TPOT_S = 1e-6
MAX_TPOT_S = 3600.0
MAX_GBPS = 1e6
MIN_LINK_GBPS = 1e-3
MIN_UTILIZATION_CAP = 1e-3
MAX_WEIGHT = 1e6
MAX_MODEL_BYTES = 1 << 50


def _id(field: str, value: str) -> str:
    if not value:
        raise InvalidArgumentError(field, "must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidArgumentError(field, f"longer than {MAX_ID_LENGTH} characters")
    return value


def mig_from_proto(field: str, msg: serverless_pb2.MigSliceSpec) -> MigSliceProfile:
    if msg.profile_name:
        p = find_mig_profile(msg.profile_name)
        if p is None:
            raise InvalidArgumentError(
                f"{field}.profile_name",
                f"unknown MIG profile {msg.profile_name!r} (known: {', '.join(MIG_PROFILES)})",
            )
        return p
    if msg.sms <= 0:
        raise InvalidArgumentError(
            f"{field}.sms", f"must be > 0 (or give profile_name), got {msg.sms}"
        )
    if msg.hbm_bytes <= 0:
        raise InvalidArgumentError(f"{field}.hbm_bytes", f"must be > 0, got {msg.hbm_bytes}")
    positive(f"{field}.hbm_gbps", msg.hbm_gbps)
    return MigSliceProfile(
        name=f"custom-{msg.sms}sm", sms=msg.sms, hbm_bytes=msg.hbm_bytes, hbm_gbps=msg.hbm_gbps
    )


def _slices(field: str, msgs: Sequence[serverless_pb2.MigSliceSpec]) -> list[MigSlice]:
    if len(msgs) > MAX_SLICES:
        raise InvalidArgumentError(field, f"at most {MAX_SLICES} slices, got {len(msgs)}")
    seen: set[str] = set()
    out = []
    for i, s in enumerate(msgs):
        sid = _id(f"{field}[{i}].id", s.id)
        if sid in seen:
            raise InvalidArgumentError(f"{field}[{i}].id", f"duplicate slice id {sid!r}")
        seen.add(sid)
        out.append(MigSlice(sid, mig_from_proto(f"{field}[{i}]", s)))
    return out


def _in_range(field: str, value: float, low: float, high: float) -> float:
    if not low <= finite(field, value) <= high:
        raise InvalidArgumentError(field, f"must be in [{low}, {high}], got {value}")
    return value


def link_from_proto(field: str, msg: serverless_pb2.C2cLink) -> tuple[float, float]:
    """(link_gbps, utilization_cap)."""
    gbps = (
        _in_range(f"{field}.link_gbps", msg.link_gbps, MIN_LINK_GBPS, MAX_GBPS)
        if msg.HasField("link_gbps")
        else GH200_C2C_LINK.sustained_gbps
    )
    cap = DEFAULT_UTILIZATION_CAP
    if msg.HasField("utilization_cap"):
        cap = finite(f"{field}.utilization_cap", msg.utilization_cap)
        if not MIN_UTILIZATION_CAP <= cap <= 1.0:
            raise InvalidArgumentError(
                f"{field}.utilization_cap", f"must be in [{MIN_UTILIZATION_CAP}, 1], got {cap}"
            )
    return gbps, cap


def builtin_model(field: str, name: str) -> ModelProfile:
    model = find_model(name)
    if model is None:
        known = ", ".join(sorted(MODEL_PROFILES))
        raise InvalidArgumentError(field, f"unknown model profile {name!r} (known: {known})")
    return model


def model_from_proto(field: str, msg: serverless_pb2.ServerlessModelSpec) -> ServerlessModel:
    name = _id(f"{field}.name", msg.name)
    weight_bytes = msg.weight_bytes
    if not 0 <= weight_bytes <= MAX_MODEL_BYTES:
        raise InvalidArgumentError(
            f"{field}.weight_bytes", f"must be in [0, {MAX_MODEL_BYTES}], got {weight_bytes}"
        )
    if weight_bytes == 0:
        profile_field = f"{field}.profile_name" if msg.profile_name else f"{field}.weight_bytes"
        if not msg.profile_name and find_model(name) is None:
            raise InvalidArgumentError(
                profile_field, "must be > 0 unless profile_name (or name) is a built-in model"
            )
        weight_bytes = builtin_model(profile_field, msg.profile_name or name).param_bytes
    _in_range(f"{field}.tpot_s", msg.tpot_s, MIN_TPOT_S, MAX_TPOT_S)
    if not 0 <= msg.hbm_bytes <= MAX_MODEL_BYTES:
        raise InvalidArgumentError(
            f"{field}.hbm_bytes", f"must be in [0, {MAX_MODEL_BYTES}], got {msg.hbm_bytes}"
        )
    _in_range(f"{field}.hbm_gbps", msg.hbm_gbps, 0, MAX_GBPS)
    if msg.min_sms < 0:
        raise InvalidArgumentError(f"{field}.min_sms", f"must be >= 0, got {msg.min_sms}")
    weight = 1.0
    if msg.HasField("weight"):
        positive(f"{field}.weight", msg.weight)
        weight = _in_range(f"{field}.weight", msg.weight, 0, MAX_WEIGHT)
    return ServerlessModel(
        name=name,
        weight_bytes=weight_bytes,
        tpot_s=msg.tpot_s,
        hbm_bytes=msg.hbm_bytes,
        hbm_gbps=msg.hbm_gbps,
        min_sms=msg.min_sms,
        weight=weight,
        required=msg.required,
    )


_METHODS = {
    serverless_pb2.PLACEMENT_METHOD_UNSPECIFIED: "auto",
    serverless_pb2.PLACEMENT_METHOD_AUTO: "auto",
    serverless_pb2.PLACEMENT_METHOD_GREEDY: "greedy",
    serverless_pb2.PLACEMENT_METHOD_SOLVER: "solver",
}


def placement_request_from_proto(
    msg: serverless_pb2.PlanModelPlacementRequest, time_remaining_s: float | None
) -> tuple[list[ServerlessModel], list[MigSlice], PlacementParams]:
    if len(msg.models) > MAX_MODELS:
        raise InvalidArgumentError("models", f"at most {MAX_MODELS} models, got {len(msg.models)}")
    models = [model_from_proto(f"models[{i}]", m) for i, m in enumerate(msg.models)]
    names: set[str] = set()
    for i, m in enumerate(models):
        if m.name in names:
            raise InvalidArgumentError(f"models[{i}].name", f"duplicate model {m.name!r}")
        names.add(m.name)
    slices = _slices("slices", msg.slices)
    if not slices:
        raise InvalidArgumentError("slices", "at least one slice is needed")
    gbps, cap = link_from_proto("link", msg.link)
    per_slice = msg.max_models_per_slice or 1
    if per_slice < 0:
        raise InvalidArgumentError(
            "max_models_per_slice", f"must be >= 0, got {msg.max_models_per_slice}"
        )
    lam = (
        non_negative("contention_weight", msg.contention_weight)
        if msg.HasField("contention_weight")
        else 1e-3
    )
    try:
        method = _METHODS[msg.method]
    except KeyError:
        raise InvalidArgumentError("method", f"unknown value {msg.method}") from None
    solver = msg.solver
    backend = model_solver_from_proto("solver.backend", solver.backend)
    limit = time_limit_from_proto(solver, DEFAULT_TIME_LIMIT_S, time_remaining_s, DEADLINE_MARGIN_S)
    params = PlacementParams(
        link_gbps=gbps,
        utilization_cap=cap,
        max_models_per_slice=per_slice,
        contention_weight=lam,
        method=method,
        backend=backend,
        time_limit_s=limit,
    )
    return models, slices, params


_SOURCES = {
    "greedy": serverless_pb2.PLACEMENT_SOURCE_GREEDY,
    "greedy-proven": serverless_pb2.PLACEMENT_SOURCE_GREEDY_PROVEN,
    "solver": serverless_pb2.PLACEMENT_SOURCE_SOLVER,
    "greedy-fallback": serverless_pb2.PLACEMENT_SOURCE_GREEDY_FALLBACK,
    "infeasible": serverless_pb2.PLACEMENT_SOURCE_INFEASIBLE,
}


def placement_plan_to_proto(plan: PlacementPlan) -> serverless_pb2.PlanModelPlacementResponse:
    out = serverless_pb2.PlanModelPlacementResponse(
        assignments=[
            serverless_pb2.ModelOnSlice(model=a.model, slice_id=a.slice_id, c2c_gbps=a.c2c_gbps)
            for a in plan.assignments
        ],
        unplaced=[serverless_pb2.UnplacedModel(model=n, reason=r) for n, r in plan.unplaced],
        link_demand_gbps=plan.link_demand_gbps,
        link_budget_gbps=plan.link_budget_gbps,
        max_slice_hbm_utilization=plan.max_slice_hbm_utilization,
        served_weight=plan.served_weight,
        objective=plan.objective,
        greedy_objective=plan.greedy_objective,
        source=_SOURCES[plan.source],
        feasible=plan.feasible,
        summary=plan.summary,
    )
    if plan.solve is not None:
        out.solve.CopyFrom(plan_solve_to_proto(plan.solve))
    return out


def _slice_states(
    field: str, msgs: Sequence[serverless_pb2.SliceStatus], max_models_per_slice: int
) -> list[SliceState]:
    if len(msgs) > MAX_SLICES * MAX_MODELS_PER_SLICE:
        raise InvalidArgumentError(field, f"at most {MAX_SLICES} slices, got {len(msgs)}")
    if not msgs:
        raise InvalidArgumentError(field, "at least one slice is needed")
    states = []
    for i, s in enumerate(msgs):
        path = f"{field}[{i}]"
        sid = _id(f"{path}.slice.id", s.slice.id)
        non_negative(f"{path}.model_c2c_gbps", s.model_c2c_gbps)
        finite(f"{path}.model_priority", s.model_priority)
        finite(f"{path}.last_used_s", s.last_used_s)
        finite(f"{path}.active_since_s", s.active_since_s)
        if s.in_flight < 0:
            raise InvalidArgumentError(f"{path}.in_flight", f"must be >= 0, got {s.in_flight}")
        if not s.model and s.in_flight:
            raise InvalidArgumentError(f"{path}.in_flight", "an idle slice has nothing in flight")
        slack = finite(f"{path}.slack_s", s.slack_s) if s.HasField("slack_s") else math.inf
        states.append(
            SliceState(
                id=sid,
                profile=mig_from_proto(f"{path}.slice", s.slice),
                model=s.model,
                model_c2c_gbps=s.model_c2c_gbps,
                model_priority=s.model_priority,
                in_flight=s.in_flight,
                last_used_s=s.last_used_s,
                active_since_s=s.active_since_s,
                slack_s=slack,
            )
        )
    try:
        check_slices(states, max_models_per_slice)
    except ValueError as exc:
        raise InvalidArgumentError(field, str(exc)) from None
    return states


def _models_per_slice(field: str, value: int) -> int:
    if not 0 <= value <= MAX_MODELS_PER_SLICE:
        raise InvalidArgumentError(field, f"must be in [0, {MAX_MODELS_PER_SLICE}], got {value}")
    return max(1, value)


def preemption_from_proto(field: str, msg: serverless_pb2.Preemption) -> PreemptionParams:
    for name in ("min_hold_s", "victim_slack_s", "starve_after_s"):
        non_negative(f"{field}.{name}", getattr(msg, name))
    finite(f"{field}.urgent_slack_s", msg.urgent_slack_s)
    return PreemptionParams(
        min_hold_s=msg.min_hold_s,
        urgent_slack_s=msg.urgent_slack_s,
        victim_slack_s=msg.victim_slack_s,
        starve_after_s=msg.starve_after_s,
    )


@dataclass(frozen=True, slots=True)
class RouteCall:
    """A RouteRequest, checked: route_request's arguments."""

    model: ServerlessModel
    slices: list[SliceState]
    priority: float
    link_budget_gbps: float
    now_s: float
    waited_s: float
    slack_s: float
    preemption: PreemptionParams | None
    max_models_per_slice: int


def route_request_from_proto(msg: serverless_pb2.RouteRequest) -> RouteCall:
    model = model_from_proto("model", msg.model)
    finite("priority", msg.priority)
    per_slice = _models_per_slice("max_models_per_slice", msg.max_models_per_slice)
    states = _slice_states("slices", msg.slices, per_slice)
    gbps, cap = link_from_proto("link", msg.link)
    return RouteCall(
        model=model,
        slices=states,
        priority=msg.priority,
        link_budget_gbps=gbps * cap,
        now_s=finite("now_s", msg.now_s),
        waited_s=non_negative("waited_s", msg.waited_s),
        slack_s=finite("slack_s", msg.slack_s) if msg.HasField("slack_s") else math.inf,
        preemption=(
            preemption_from_proto("preemption", msg.preemption)
            if msg.HasField("preemption")
            else None
        ),
        max_models_per_slice=per_slice,
    )


@dataclass(frozen=True, slots=True)
class ScheduleCall:
    """A ScheduleWaitingRequest, checked: schedule_waiting's arguments."""

    waiting: list[WaitingModel]
    slices: list[SliceState]
    link_budget_gbps: float
    now_s: float
    preemption: PreemptionParams | None
    max_models_per_slice: int


def schedule_request_from_proto(msg: serverless_pb2.ScheduleWaitingRequest) -> ScheduleCall:
    if len(msg.waiting) > MAX_MODELS:
        raise InvalidArgumentError(
            "waiting", f"at most {MAX_MODELS} models, got {len(msg.waiting)}"
        )
    now = finite("now_s", msg.now_s)
    waiting = []
    seen: set[str] = set()
    for i, w in enumerate(msg.waiting):
        path = f"waiting[{i}]"
        model = model_from_proto(f"{path}.model", w.model)
        if model.name in seen:
            raise InvalidArgumentError(f"{path}.model.name", f"duplicate model {model.name!r}")
        seen.add(model.name)
        finite(f"{path}.priority", w.priority)
        since = finite(f"{path}.waiting_since_s", w.waiting_since_s)
        if since > now:
            raise InvalidArgumentError(
                f"{path}.waiting_since_s", f"must be <= now_s ({now}), got {since}"
            )
        if w.requests <= 0:
            raise InvalidArgumentError(f"{path}.requests", f"must be > 0, got {w.requests}")
        slack = finite(f"{path}.slack_s", w.slack_s) if w.HasField("slack_s") else math.inf
        waiting.append(WaitingModel(model, w.priority, since, w.requests, slack))
    per_slice = _models_per_slice("max_models_per_slice", msg.max_models_per_slice)
    states = _slice_states("slices", msg.slices, per_slice)
    gbps, cap = link_from_proto("link", msg.link)
    preemption = (
        preemption_from_proto("preemption", msg.preemption)
        if msg.HasField("preemption") and not msg.no_preempt
        else None
    )
    return ScheduleCall(waiting, states, gbps * cap, now, preemption, per_slice)


_ACTIONS = {
    "active": serverless_pb2.ROUTE_ACTION_ACTIVE,
    "idle": serverless_pb2.ROUTE_ACTION_IDLE,
    "evict": serverless_pb2.ROUTE_ACTION_EVICT,
    "queue": serverless_pb2.ROUTE_ACTION_QUEUE,
    "share": serverless_pb2.ROUTE_ACTION_SHARE,
}


def route_decision_to_proto(d: RouteDecision) -> serverless_pb2.RouteResponse:
    return serverless_pb2.RouteResponse(
        action=_ACTIONS[d.action],
        slice_id=d.slice_id,
        evicted_model=d.evicted_model,
        link_demand_gbps=d.link_demand_gbps,
        link_budget_gbps=d.link_budget_gbps,
        reason=d.reason,
        preempts=d.preempts,
        eviction=d.eviction,
    )


def schedule_to_proto(
    routes: Sequence[ScheduledRoute],
) -> serverless_pb2.ScheduleWaitingResponse:
    return serverless_pb2.ScheduleWaitingResponse(
        routes=[
            serverless_pb2.ModelRoute(model=r.model, decision=route_decision_to_proto(r.decision))
            for r in routes
        ]
    )


def chunk_rows_from_proto(
    field: str, rows: Sequence[serverless_pb2.ChunkProfileRow]
) -> list[ChunkRow]:
    if len(rows) > MAX_CHUNK_ROWS:
        raise InvalidArgumentError(field, f"at most {MAX_CHUNK_ROWS} rows, got {len(rows)}")
    out = []
    seen: set[int] = set()
    for i, r in enumerate(rows):
        path = f"{field}[{i}]"
        if not 0 < r.chunk_tokens <= MAX_TOKENS:
            raise InvalidArgumentError(
                f"{path}.chunk_tokens", f"must be in [1, {MAX_TOKENS}], got {r.chunk_tokens}"
            )
        if r.chunk_tokens in seen:
            raise InvalidArgumentError(f"{path}.chunk_tokens", f"duplicate size {r.chunk_tokens}")
        seen.add(r.chunk_tokens)
        positive(f"{path}.ttft_s", r.ttft_s)
        non_negative(f"{path}.hbm_bytes", r.hbm_bytes)
        non_negative(f"{path}.flops", r.flops)
        non_negative(f"{path}.burst_c2c_gbps", r.burst_c2c_gbps)
        if r.chunks < 0:
            raise InvalidArgumentError(f"{path}.chunks", f"must be >= 0, got {r.chunks}")
        out.append(
            ChunkRow(
                chunk_tokens=r.chunk_tokens,
                chunks=r.chunks,
                ttft_s=r.ttft_s,
                c2c_bytes=0.0,
                hbm_bytes=r.hbm_bytes,
                flops=r.flops,
                chunk_time_s=0.0,
                burst_c2c_gbps=r.burst_c2c_gbps,
            )
        )
    return out


def chunk_row_to_proto(r: ChunkRow) -> serverless_pb2.ChunkProfileRow:
    return serverless_pb2.ChunkProfileRow(
        chunk_tokens=r.chunk_tokens,
        chunks=r.chunks,
        ttft_s=r.ttft_s,
        hbm_bytes=r.hbm_bytes,
        flops=r.flops,
        burst_c2c_gbps=r.burst_c2c_gbps,
    )


def chunk_choice_to_proto(
    c: ChunkChoice, table: Sequence[ChunkRow]
) -> serverless_pb2.ChooseChunkSizeResponse:
    return serverless_pb2.ChooseChunkSizeResponse(
        chunk_tokens=c.chunk_tokens,
        meets_target=c.meets_target,
        ttft_s=c.ttft_s,
        hbm_gbps_needed=c.hbm_gbps_needed,
        compute_tflops_needed=c.compute_tflops_needed,
        burst_c2c_gbps=c.burst_c2c_gbps,
        reason=c.reason,
        table=[chunk_row_to_proto(r) for r in sorted(table, key=lambda r: r.chunk_tokens)],
    )


def kernel_choice_to_proto(k: KernelChoice) -> serverless_pb2.ChooseKernelResponse:
    return serverless_pb2.ChooseKernelResponse(
        family=k.family,
        precision=k.precision,
        shape=k.shape,
        sym_block_m=k.sym_block_m,
        block_n=k.block_n,
        asym_block_k=k.asym_block_k,
        initial_rho=k.initial_rho,
        model_best_rho=k.model_best_rho,
        reason=k.reason,
    )


_PARAM_FIELDS = (
    "ewma_alpha",
    "theta",
    "step_small",
    "step_large",
    "max_step",
    "min_step",
    "rho_min",
    "rho_max",
    "recover_after",
    "min_interval_s",
)


def tuner_params_from_proto(
    field: str, msg: serverless_pb2.KnobTunerParams, base: TunerParams
) -> TunerParams | None:
    """The parameters with the set fields replaced (None: none set)."""
    given = {f.name: value for f, value in msg.ListFields() if f.name in _PARAM_FIELDS}
    if not given:
        return None
    for name, value in given.items():
        finite(f"{field}.{name}", float(value))
    merged = {name: getattr(base, name) for name in _PARAM_FIELDS}
    merged.update(given)
    params = TunerParams(**merged)
    try:
        params.check()
    except ValueError as exc:
        name, _, reason = str(exc).partition(": ")
        raise InvalidArgumentError(f"{field}.{name}", reason) from None
    return params


def tuner_state_to_proto(s: TunerState) -> serverless_pb2.KnobTunerState:
    out = serverless_pb2.KnobTunerState(
        rho=s.rho,
        latency_s=s.latency_s,
        hbm_util=s.hbm_util,
        c2c_util=s.c2c_util,
        samples=s.samples,
        updates=s.updates,
        last_direction=s.last_direction,
        step_scale=s.step_scale,
    )
    if math.isfinite(s.last_update_s):
        out.last_update_s = s.last_update_s
    return out


def knob_decision_to_proto(
    d: KnobDecision, state: TunerState
) -> serverless_pb2.ReportKnobFeedbackResponse:
    return serverless_pb2.ReportKnobFeedbackResponse(
        rho=d.rho,
        changed=d.changed,
        direction=d.direction,
        step=d.step,
        imbalance=d.imbalance,
        over_budget=d.over_budget,
        reason=d.reason,
        state=tuner_state_to_proto(state),
    )
