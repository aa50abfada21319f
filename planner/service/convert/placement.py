"""PlacementService messages: field checks (INVALID_ARGUMENT naming the
field) and conversions to and from the AQUA policies' inputs and outputs."""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.domain.placement import (
    BatchPoint,
    CfsInputs,
    CfsPlan,
    CfsRequest,
    DeploymentProfile,
    MatchGpu,
    PlacedModel,
    Placement,
    PlacementInputs,
    PlacerObjective,
    RatePoint,
    Role,
    RoleConfig,
    RoleDecision,
    ServerMatching,
)
from planner.policies.aqua.placer import DEFAULT_TIME_LIMIT_S
from planner.policies.aqua.roles import DEFAULT_ATTAINMENT
from planner.profiles import find_hardware, find_model
from planner.profiles.errors import ProfileError
from planner.service.convert.checks import finite, non_negative, positive
from planner.service.convert.solver import (
    model_solver_from_proto,
    relative_gap_from_proto,
    solve_stats_to_proto,
    time_limit_from_proto,
)
from planner.service.errors import FailedPreconditionError, InvalidArgumentError
from planner.service.limits import MAX_ID_LENGTH
from planner.service.role_oracles import RoleOracles
from planner.v1 import placement_pb2

MAX_BYTES = 1 << 62
# Consumers of revoked leases have this long to move tensors to DRAM by default.
DEFAULT_GRACE_S = 1.0
# Left of the caller's deadline for answering after the solve.
DEADLINE_MARGIN_S = 0.005


def _id(field: str, value: str, required: bool = True) -> str:
    if required and not value:
        raise InvalidArgumentError(field, "required (a non-empty string)")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidArgumentError(field, f"longer than {MAX_ID_LENGTH} characters")
    return value


def _unique_id(field: str, value: str, seen: set[str]) -> str:
    """A required id not in seen (the ids before it), added to seen."""
    _id(field, value)
    if value in seen:
        raise InvalidArgumentError(field, f"duplicate id {value!r}")
    seen.add(value)
    return value


def _bytes(field: str, value: int, positive: bool = False) -> int:
    low = 1 if positive else 0
    if not low <= value <= MAX_BYTES:
        raise InvalidArgumentError(field, f"must be in [{low}, {MAX_BYTES}], got {value}")
    return value


def _keyed(
    msg: placement_pb2.OfferMemoryRequest
    | placement_pb2.AllocateMemoryRequest
    | placement_pb2.FreeMemoryRequest
    | placement_pb2.ReclaimMemoryRequest,
) -> None:
    _id("pool_id", msg.pool_id)
    _id("idempotency_key", msg.idempotency_key)


def check_offer(msg: placement_pb2.OfferMemoryRequest) -> None:
    _keyed(msg)
    _id("producer_id", msg.producer_id)
    _id("server_id", msg.server_id, required=False)
    _bytes("bytes", msg.bytes, positive=True)


def check_allocate(msg: placement_pb2.AllocateMemoryRequest) -> None:
    _keyed(msg)
    _id("consumer_id", msg.consumer_id)
    _id("producer_id", msg.producer_id, required=False)
    _id("server_id", msg.server_id, required=False)
    _bytes("bytes", msg.bytes, positive=True)
    finite("now_s", msg.now_s)


def check_free(msg: placement_pb2.FreeMemoryRequest) -> None:
    _keyed(msg)
    _id("lease_id", msg.lease_id)


def check_reclaim(msg: placement_pb2.ReclaimMemoryRequest) -> None:
    _keyed(msg)
    _id("producer_id", msg.producer_id)
    _bytes("bytes", msg.bytes)
    finite("now_s", msg.now_s)
    if msg.HasField("grace_s"):
        non_negative("grace_s", msg.grace_s)
        if not math.isfinite(msg.now_s + msg.grace_s):
            raise InvalidArgumentError("grace_s", "now_s + grace_s must be finite")


def check_status(msg: placement_pb2.GetPoolStatusRequest) -> None:
    _id("pool_id", msg.pool_id)
    _id("producer_id", msg.producer_id, required=False)
    _id("consumer_id", msg.consumer_id, required=False)
    finite("now_s", msg.now_s)


# ---- roles --------------------------------------------------------------------

_ROLES = {
    Role.PRODUCER: placement_pb2.DEPLOYMENT_ROLE_PRODUCER,
    Role.CONSUMER: placement_pb2.DEPLOYMENT_ROLE_CONSUMER,
    Role.NEUTRAL: placement_pb2.DEPLOYMENT_ROLE_NEUTRAL,
}
MAX_DEPLOYMENTS = 65_536
MAX_CURVE_POINTS = 10_000


MAX_REPLAY_DURATION_S = 600.0


@dataclass(frozen=True, slots=True)
class ReplayRoleParams:
    """The replay oracle's knobs of a ClassifyRoles request."""

    # Deployment id -> MODEL@HARDWARE, for those with replay_profile.
    profiles: dict[str, str]
    attainment: float = DEFAULT_ATTAINMENT
    # None: the oracle's default.
    duration_s: float | None = None
    seed: int = 0


def _replay_profile(field: str, name: str, oracles: RoleOracles | None) -> str:
    """A built-in MODEL@HARDWARE name (no files: the service reads none)."""
    model, sep, hardware = name.partition("@")
    if not sep or find_model(model) is None or find_hardware(hardware) is None:
        raise InvalidArgumentError(
            field, f"expected a built-in MODEL@HARDWARE profile name, got {name[:200]!r}"
        )
    if oracles is None:
        raise FailedPreconditionError(
            field, "this server was started without the replay oracle (planner serve has it)"
        )
    try:
        oracles.check(name)
    except ProfileError as exc:
        raise InvalidArgumentError(field, str(exc)) from None
    return name


def replay_roles_from_proto(msg: placement_pb2.ClassifyRolesRequest) -> ReplayRoleParams:
    """The replay oracle's knobs; call after roles_request_from_proto (which
    checks each replay_profile)."""
    p = msg.params
    attainment = p.attainment if p.HasField("attainment") else DEFAULT_ATTAINMENT
    if not 0 < attainment <= 1:
        raise InvalidArgumentError("params.attainment", f"must be in (0, 1], got {attainment}")
    duration = p.replay_duration_s if p.HasField("replay_duration_s") else None
    if duration is not None and not 0 < duration <= MAX_REPLAY_DURATION_S:
        raise InvalidArgumentError(
            "params.replay_duration_s",
            f"must be in (0, {MAX_REPLAY_DURATION_S:g}], got {duration}",
        )
    if p.replay_seed < 0:
        raise InvalidArgumentError("params.replay_seed", f"must be >= 0, got {p.replay_seed}")
    return ReplayRoleParams(
        profiles={d.id: d.replay_profile for d in msg.deployments if d.HasField("replay_profile")},
        attainment=attainment,
        duration_s=duration,
        seed=p.replay_seed,
    )


def roles_request_from_proto(
    msg: placement_pb2.ClassifyRolesRequest, oracles: RoleOracles | None
) -> tuple[list[DeploymentProfile], RoleConfig]:
    """oracles: what runs the deployments that name a replay_profile."""
    if len(msg.deployments) > MAX_DEPLOYMENTS:
        raise InvalidArgumentError("deployments", f"more than {MAX_DEPLOYMENTS}")
    p = msg.params
    defaults = RoleConfig()
    threshold = p.threshold_bytes if p.HasField("threshold_bytes") else defaults.threshold_bytes
    _bytes("params.threshold_bytes", threshold)
    tol = p.saturation_tolerance if p.HasField("saturation_tolerance") else 0.05
    if not 0 <= tol < 1:
        raise InvalidArgumentError("params.saturation_tolerance", f"must be in [0, 1), got {tol}")
    step = p.rate_step_rps if p.HasField("rate_step_rps") else defaults.rate_step_rps
    positive("params.rate_step_rps", step)
    low = non_negative("params.rate_low_rps", p.rate_low_rps)
    high = non_negative("params.rate_high_rps", p.rate_high_rps)
    if high and low > high:
        raise InvalidArgumentError("params.rate_high_rps", "must be >= rate_low_rps")
    config = RoleConfig(threshold, tol, low, high, step)
    seen: set[str] = set()
    out = []
    for i, d in enumerate(msg.deployments):
        f = f"deployments[{i}]"
        _unique_id(f"{f}.id", d.id, seen)
        _bytes(f"{f}.gpu_memory_bytes", d.gpu_memory_bytes, positive=True)
        _bytes(f"{f}.swap_demand_bytes", d.swap_demand_bytes)
        has_replay = d.HasField("replay_profile")
        if bool(d.batch_curve) + bool(d.rate_curve) + has_replay != 1:
            raise InvalidArgumentError(
                f"{f}", "needs exactly one of batch_curve, rate_curve and replay_profile"
            )
        if has_replay:
            _replay_profile(f"{f}.replay_profile", d.replay_profile, oracles)
        if len(d.batch_curve) + len(d.rate_curve) > MAX_CURVE_POINTS:
            raise InvalidArgumentError(f"{f}", f"more than {MAX_CURVE_POINTS} curve points")
        batch = []
        for j, b in enumerate(d.batch_curve):
            if b.batch_size <= 0:
                raise InvalidArgumentError(f"{f}.batch_curve[{j}].batch_size", "must be > 0")
            non_negative(f"{f}.batch_curve[{j}].throughput", b.throughput)
            _bytes(f"{f}.batch_curve[{j}].used_bytes", b.used_bytes)
            batch.append(BatchPoint(b.batch_size, b.throughput, b.used_bytes))
        rates = []
        for j, r in enumerate(d.rate_curve):
            g = f"{f}.rate_curve[{j}]"
            non_negative(f"{g}.rate_rps", r.rate_rps)
            non_negative(f"{g}.ttft_s", r.ttft_s)
            non_negative(f"{g}.tbt_s", r.tbt_s)
            _bytes(f"{g}.used_bytes", r.used_bytes)
            rates.append(RatePoint(r.rate_rps, r.ttft_s, r.tbt_s, r.used_bytes))
        if len({r.rate_rps for r in rates}) != len(rates):
            raise InvalidArgumentError(f"{f}.rate_curve", "two points at the same rate_rps")
        out.append(
            DeploymentProfile(
                id=d.id,
                gpu_memory_bytes=d.gpu_memory_bytes,
                batch_curve=tuple(batch),
                rate_curve=tuple(rates),
                slo_ttft_s=positive(f"{f}.slo_ttft_s", d.slo_ttft_s)
                if d.HasField("slo_ttft_s")
                else 1.0,
                slo_tbt_s=positive(f"{f}.slo_tbt_s", d.slo_tbt_s)
                if d.HasField("slo_tbt_s")
                else 0.1,
                swap_demand_bytes=d.swap_demand_bytes,
            )
        )
    return out, config


def role_to_proto(d: RoleDecision) -> placement_pb2.DeploymentRoleDecision:
    return placement_pb2.DeploymentRoleDecision(
        id=d.id,
        role=_ROLES[d.role],
        r_bytes=d.r_bytes,
        free_bytes=d.free_bytes,
        batch_size=d.batch_size,
        sustainable_rate_rps=d.sustainable_rate_rps,
        probes_rps=d.probes_rps,
        reason=d.reason,
    )


# ---- placement -------------------------------------------------------------------

MAX_MODELS = 4096
MAX_SERVERS = 1024
_OBJECTIVES = {
    placement_pb2.PLACER_OBJECTIVE_UNSPECIFIED: PlacerObjective.BALANCED_ABS,
    placement_pb2.PLACER_OBJECTIVE_BALANCED_ABS: PlacerObjective.BALANCED_ABS,
    placement_pb2.PLACER_OBJECTIVE_PAPER: PlacerObjective.PAPER,
}


def place_request_from_proto(
    msg: placement_pb2.PlaceModelsRequest, time_remaining_s: float | None
) -> tuple[PlacementInputs, str, float, float]:
    """(inputs, backend, time limit, relative gap)."""
    if not 0 < msg.num_servers <= MAX_SERVERS:
        raise InvalidArgumentError("num_servers", f"must be in [1, {MAX_SERVERS}]")
    if not 0 < msg.gpus_per_server <= 1024:
        raise InvalidArgumentError("gpus_per_server", "must be in [1, 1024]")
    _bytes("gpu_memory_bytes", msg.gpu_memory_bytes, positive=True)
    if len(msg.models) > MAX_MODELS:
        raise InvalidArgumentError("models", f"more than {MAX_MODELS}")
    try:
        objective = _OBJECTIVES[msg.objective]
    except KeyError:
        raise InvalidArgumentError("objective", f"unknown value {msg.objective}") from None
    seen: set[str] = set()
    models = []
    for i, m in enumerate(msg.models):
        f = f"models[{i}]"
        _unique_id(f"{f}.id", m.id, seen)
        if abs(m.r_bytes) > MAX_BYTES:
            raise InvalidArgumentError(f"{f}.r_bytes", f"|r_bytes| must be <= {MAX_BYTES}")
        shards = m.shards or 1
        if not 1 <= shards <= msg.gpus_per_server:
            raise InvalidArgumentError(
                f"{f}.shards", f"must be in [1, gpus_per_server={msg.gpus_per_server}]"
            )
        current = None
        if m.HasField("current_server"):
            if not 0 <= m.current_server < msg.num_servers:
                raise InvalidArgumentError(f"{f}.current_server", "must be in [0, num_servers)")
            current = m.current_server
        models.append(PlacedModel(m.id, m.r_bytes, shards, current))
    move_cost = None
    if msg.HasField("move_cost_bytes"):
        move_cost = _bytes("move_cost_bytes", msg.move_cost_bytes)
    max_moves = None
    if msg.HasField("max_moves"):
        if msg.max_moves < 0:
            raise InvalidArgumentError("max_moves", "must be >= 0")
        max_moves = msg.max_moves
    total = sum(m.shards for m in models)
    if total > msg.num_servers * msg.gpus_per_server:
        raise InvalidArgumentError(
            "models", f"{total} shards need more GPUs than the {msg.num_servers} servers have"
        )
    backend = model_solver_from_proto("solver.backend", msg.solver.backend)
    limit = time_limit_from_proto(
        msg.solver, DEFAULT_TIME_LIMIT_S, time_remaining_s, DEADLINE_MARGIN_S, floor_s=1e-3
    )
    gap = relative_gap_from_proto(msg.solver)
    inputs = PlacementInputs(
        models=tuple(models),
        num_servers=msg.num_servers,
        gpus_per_server=msg.gpus_per_server,
        gpu_memory_bytes=msg.gpu_memory_bytes,
        objective=objective,
        move_cost_bytes=move_cost,
        max_moves=max_moves,
    )
    return inputs, backend, limit, gap


def placement_to_proto(
    inputs: PlacementInputs, p: Placement, limit_s: float
) -> placement_pb2.PlaceModelsResponse:
    out = placement_pb2.PlaceModelsResponse(
        servers=p.servers, objective_bytes=p.objective_bytes, moves=p.moves, fallback=p.fallback
    )
    for s in range(inputs.num_servers):
        ids = [m.id for m, x in zip(inputs.models, p.servers, strict=True) if x == s]
        used = sum(m.shards for m, x in zip(inputs.models, p.servers, strict=True) if x == s)
        out.loads.append(
            placement_pb2.ServerLoad(
                server=s, mem_bytes=p.mem_bytes[s], eq=p.eq[s], gpus_used=used, model_ids=ids
            )
        )
    out.stats.CopyFrom(
        solve_stats_to_proto(
            backend=p.backend,
            status=p.status,
            objective=p.objective_bytes,
            best_bound=p.best_bound_bytes,
            gap=p.gap,
            wall_s=p.wall_time_s,
            time_limit_s=limit_s,
            note=p.note,
        )
    )
    return out


# ---- matching -------------------------------------------------------------------

MAX_GPUS_PER_SERVER = 1024


def match_request_from_proto(
    msg: placement_pb2.MatchProducersRequest,
) -> list[tuple[str, list[MatchGpu]]]:
    if len(msg.servers) > MAX_SERVERS * 64:
        raise InvalidArgumentError("servers", "too many servers")
    seen: set[str] = set()
    out = []
    for i, s in enumerate(msg.servers):
        f = f"servers[{i}]"
        _id(f"{f}.server_id", s.server_id, required=False)
        if len(s.gpus) > MAX_GPUS_PER_SERVER:
            raise InvalidArgumentError(f"{f}.gpus", f"more than {MAX_GPUS_PER_SERVER}")
        gpus = []
        for j, g in enumerate(s.gpus):
            h = f"{f}.gpus[{j}]"
            _unique_id(f"{h}.id", g.id, seen)
            _bytes(f"{h}.spare_bytes", g.spare_bytes)
            _bytes(f"{h}.demand_bytes", g.demand_bytes)
            if g.spare_bytes and g.demand_bytes:
                raise InvalidArgumentError(h, "a GPU either has spare_bytes or demand_bytes")
            non_negative(f"{h}.link_gbps", g.link_gbps)
            non_negative(f"{h}.paging_gbps", g.paging_gbps)
            gpus.append(MatchGpu(g.id, g.spare_bytes, g.demand_bytes, g.link_gbps, g.paging_gbps))
        out.append((s.server_id, gpus))
    return out


def matching_to_proto(server_id: str, m: ServerMatching) -> placement_pb2.ServerMatch:
    return placement_pb2.ServerMatch(
        server_id=server_id,
        pairs=[
            placement_pb2.ProducerConsumerPair(
                producer_id=p.producer_id,
                consumer_id=p.consumer_id,
                covered_bytes=p.covered_bytes,
                dram_bytes=p.dram_bytes,
                headroom_gbps=p.headroom_gbps,
            )
            for p in m.pairs
        ],
        dram_consumer_ids=m.dram_consumers,
        idle_producer_ids=m.idle_producers,
    )


# ---- CFS ----------------------------------------------------------------------

MAX_CFS_REQUESTS = 100_000
MAX_TOKENS = 1 << 40
# Leaves room for iteration + reschedule_every in the response's int64.
MAX_ITERATION = 1 << 62


def cfs_request_from_proto(msg: placement_pb2.PartitionBatchRequest) -> CfsInputs:
    if len(msg.requests) > MAX_CFS_REQUESTS:
        raise InvalidArgumentError("requests", f"more than {MAX_CFS_REQUESTS}")
    if not 0 < msg.token_budget <= MAX_TOKENS:
        raise InvalidArgumentError("token_budget", f"must be in [1, {MAX_TOKENS}]")
    if not 0 <= msg.gpu_blocks <= MAX_TOKENS:
        raise InvalidArgumentError("gpu_blocks", f"must be in [0, {MAX_TOKENS}]")
    if not 0 <= msg.block_size <= 1 << 16:
        raise InvalidArgumentError("block_size", "must be in [0, 65536] (0: 16)")
    if msg.reschedule_every < 0:
        raise InvalidArgumentError("reschedule_every", "must be >= 0 (0: 8)")
    if not 0 <= msg.iteration <= MAX_ITERATION:
        raise InvalidArgumentError("iteration", f"must be in [0, {MAX_ITERATION}]")
    seen: set[str] = set()
    out = []
    for i, r in enumerate(msg.requests):
        f = f"requests[{i}]"
        _unique_id(f"{f}.id", r.id, seen)
        if not 0 < r.prompt_tokens <= MAX_TOKENS:
            raise InvalidArgumentError(f"{f}.prompt_tokens", "must be in [1, 2^40]")
        if not 0 <= r.prefilled_tokens <= r.prompt_tokens:
            raise InvalidArgumentError(f"{f}.prefilled_tokens", "must be in [0, prompt_tokens]")
        if not 0 <= r.generated_tokens <= MAX_TOKENS:
            raise InvalidArgumentError(f"{f}.generated_tokens", "must be in [0, 2^40]")
        if r.generated_tokens and r.prefilled_tokens < r.prompt_tokens:
            raise InvalidArgumentError(
                f"{f}.generated_tokens", "a request generates only after its prefill"
            )
        finite(f"{f}.arrival_s", r.arrival_s)
        out.append(
            CfsRequest(
                r.id,
                r.prompt_tokens,
                r.prefilled_tokens,
                r.generated_tokens,
                r.resident,
                r.arrival_s,
            )
        )
    return CfsInputs(
        requests=tuple(out),
        token_budget=msg.token_budget,
        gpu_blocks=msg.gpu_blocks,
        block_size=msg.block_size or 16,
        reschedule_every=msg.reschedule_every or 8,
        iteration=msg.iteration,
    )


def cfs_plan_to_proto(plan: CfsPlan) -> placement_pb2.PartitionBatchResponse:
    return placement_pb2.PartitionBatchResponse(
        decode_ids=plan.decode_ids,
        prefill_chunks=[placement_pb2.PrefillChunk(id=i, tokens=t) for i, t in plan.prefill_chunks],
        page_out_ids=plan.page_out_ids,
        page_in_ids=plan.page_in_ids,
        page_out_blocks=plan.page_out_blocks,
        page_in_blocks=plan.page_in_blocks,
        decode_slots=plan.decode_slots,
        prefill_tokens=plan.prefill_tokens,
        blocks_used=plan.blocks_used,
        next_reschedule_iteration=plan.next_reschedule_iteration,
    )
