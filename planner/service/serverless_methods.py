"""ServerlessService handlers: proto in, policy, proto out."""

from __future__ import annotations

from planner.policies.serverless.chunks import choose_chunk
from planner.policies.serverless.kernels import PRECISIONS, choose_kernel
from planner.policies.serverless.placement import plan_placement
from planner.policies.serverless.routing import route_request, schedule_waiting
from planner.policies.serverless.tuner import KnobObservation
from planner.profiles.c2c_cost import DEFAULT_CHUNK_SIZES, chunk_table
from planner.profiles.errors import ProfileError
from planner.profiles.mig import GH200_C2C_LINK
from planner.service.convert.checks import finite, non_negative, positive
from planner.service.convert.serverless import (
    MAX_CHUNK_ROWS,
    MAX_TOKENS,
    builtin_model,
    chunk_choice_to_proto,
    chunk_rows_from_proto,
    kernel_choice_to_proto,
    knob_decision_to_proto,
    mig_from_proto,
    placement_plan_to_proto,
    placement_request_from_proto,
    route_decision_to_proto,
    route_request_from_proto,
    schedule_request_from_proto,
    schedule_to_proto,
    tuner_params_from_proto,
    tuner_state_to_proto,
)
from planner.service.errors import InvalidArgumentError
from planner.service.limits import MAX_ID_LENGTH
from planner.service.serverless_tuners import ServerlessTuners
from planner.v1 import serverless_pb2


def plan_model_placement_rpc(
    msg: serverless_pb2.PlanModelPlacementRequest, time_remaining_s: float | None
) -> serverless_pb2.PlanModelPlacementResponse:
    models, slices, params = placement_request_from_proto(msg, time_remaining_s)
    try:
        plan = plan_placement(models, slices, params)
    except ValueError as exc:  # a backend that cannot take this instance (too large)
        raise InvalidArgumentError("solver.backend", str(exc)) from None
    return placement_plan_to_proto(plan)


def route_rpc(msg: serverless_pb2.RouteRequest) -> serverless_pb2.RouteResponse:
    c = route_request_from_proto(msg)
    decision = route_request(
        c.model,
        c.slices,
        priority=c.priority,
        link_budget_gbps=c.link_budget_gbps,
        allow_preempt=not msg.no_preempt,
        now_s=c.now_s,
        waited_s=c.waited_s,
        slack_s=c.slack_s,
        preemption=c.preemption,
        max_models_per_slice=c.max_models_per_slice,
    )
    return route_decision_to_proto(decision)


def schedule_waiting_rpc(
    msg: serverless_pb2.ScheduleWaitingRequest,
) -> serverless_pb2.ScheduleWaitingResponse:
    c = schedule_request_from_proto(msg)
    routes = schedule_waiting(
        c.waiting,
        c.slices,
        now_s=c.now_s,
        link_budget_gbps=c.link_budget_gbps,
        allow_preempt=not msg.no_preempt,
        preemption=c.preemption,
        max_models_per_slice=c.max_models_per_slice,
    )
    return schedule_to_proto(routes)


def choose_chunk_size_rpc(
    msg: serverless_pb2.ChooseChunkSizeRequest,
) -> serverless_pb2.ChooseChunkSizeResponse:
    mig = mig_from_proto("slice", msg.slice)
    target = positive("ttft_target_s", msg.ttft_target_s)
    if msg.table:
        table = chunk_rows_from_proto("table", msg.table)
    else:
        if not msg.model_name:
            raise InvalidArgumentError("model_name", "needed to derive the table (or give table)")
        model = builtin_model("model_name", msg.model_name)
        if not 0 < msg.prompt_tokens <= MAX_TOKENS:
            raise InvalidArgumentError(
                "prompt_tokens", f"must be in [1, {MAX_TOKENS}], got {msg.prompt_tokens}"
            )
        c2c = non_negative("c2c_gbps", msg.c2c_gbps) or GH200_C2C_LINK.sustained_gbps
        rho = finite("rho", msg.rho)
        if not 0.0 <= rho <= 1.0:
            raise InvalidArgumentError("rho", f"must be in [0, 1], got {rho}")
        if len(msg.chunk_sizes) > MAX_CHUNK_ROWS:
            raise InvalidArgumentError("chunk_sizes", f"at most {MAX_CHUNK_ROWS} sizes")
        for i, c in enumerate(msg.chunk_sizes):
            if not 0 < c <= MAX_TOKENS:
                raise InvalidArgumentError(
                    f"chunk_sizes[{i}]", f"must be in [1, {MAX_TOKENS}], got {c}"
                )
        sizes = tuple(msg.chunk_sizes) or DEFAULT_CHUNK_SIZES
        try:
            table = list(
                chunk_table(
                    model,
                    mig,
                    prompt_tokens=msg.prompt_tokens,
                    c2c_gbps=c2c,
                    rho=rho,
                    chunk_sizes=sizes,
                )
            )
        except ProfileError as exc:
            raise InvalidArgumentError(exc.field, exc.reason) from None
    choice = choose_chunk(table, ttft_target_s=target, mig=mig)
    return chunk_choice_to_proto(choice, table)


def choose_kernel_rpc(
    msg: serverless_pb2.ChooseKernelRequest, tuners: ServerlessTuners
) -> serverless_pb2.ChooseKernelResponse:
    precision = msg.precision or "bf16"
    if precision not in PRECISIONS:
        raise InvalidArgumentError(
            "precision", f"must be one of {', '.join(PRECISIONS)}, got {precision!r}"
        )
    if not 0 < msg.tokens <= MAX_TOKENS:
        raise InvalidArgumentError("tokens", f"must be in [1, {MAX_TOKENS}], got {msg.tokens}")
    mig = mig_from_proto("slice", msg.slice)
    model = builtin_model("model_name", msg.model_name) if msg.model_name else None
    c2c = non_negative("c2c_gbps", msg.c2c_gbps)
    if model is not None and c2c == 0:
        c2c = GH200_C2C_LINK.sustained_gbps
    if len(msg.gpu_id) > MAX_ID_LENGTH:
        raise InvalidArgumentError("gpu_id", f"longer than {MAX_ID_LENGTH} characters")
    if msg.gpu_id and not msg.slice.id:
        raise InvalidArgumentError("slice.id", "must name the slice whose tuner restarts")
    try:
        choice = choose_kernel(
            precision=precision, tokens=msg.tokens, mig=mig, model=model, c2c_gbps=c2c
        )
    except ProfileError as exc:
        raise InvalidArgumentError(exc.field, exc.reason) from None
    if msg.gpu_id:
        tuners.reset(msg.gpu_id, msg.slice.id, choice.initial_rho)
    return kernel_choice_to_proto(choice)


def report_knob_feedback_rpc(
    msg: serverless_pb2.ReportKnobFeedbackRequest, tuners: ServerlessTuners
) -> serverless_pb2.ReportKnobFeedbackResponse:
    for name in ("gpu_id", "slice_id"):
        value = getattr(msg, name)
        if not value:
            raise InvalidArgumentError(name, "must name the tuner's GPU and slice")
        if len(value) > MAX_ID_LENGTH:
            raise InvalidArgumentError(name, f"longer than {MAX_ID_LENGTH} characters")
    finite("now_s", msg.now_s)
    positive("latency_s", msg.latency_s)
    positive("latency_budget_s", msg.latency_budget_s)
    for name in ("hbm_util", "c2c_util"):
        v = non_negative(name, getattr(msg, name))
        if v > 1.5:
            raise InvalidArgumentError(name, f"must be a utilization in [0, 1], got {v}")
    params = tuner_params_from_proto(
        "params", msg.params, tuners.params_of(msg.gpu_id, msg.slice_id)
    )
    observation = KnobObservation(
        now_s=msg.now_s,
        latency_s=msg.latency_s,
        latency_budget_s=msg.latency_budget_s,
        hbm_util=min(msg.hbm_util, 1.0),
        c2c_util=min(msg.c2c_util, 1.0),
        at_boundary=not msg.mid_layer,
    )
    decision, state = tuners.observe(msg.gpu_id, msg.slice_id, observation, params)
    return knob_decision_to_proto(decision, state)


def get_knob_state_rpc(
    msg: serverless_pb2.GetKnobStateRequest, tuners: ServerlessTuners
) -> serverless_pb2.GetKnobStateResponse:
    if not msg.gpu_id:
        raise InvalidArgumentError("gpu_id", "must not be empty")
    return serverless_pb2.GetKnobStateResponse(
        slices=[
            serverless_pb2.SliceKnob(slice_id=sid, state=tuner_state_to_proto(s))
            for sid, s in tuners.states(msg.gpu_id)
        ]
    )
