"""PlacementService's stateless decisions (roles, placement, matching, CFS
batch partitioning); the
lease ledger's handlers are in placement_ledger.py."""

from __future__ import annotations

from planner.domain.requests import Slo
from planner.policies.aqua import classify, match_server, partition_batch, place_models
from planner.service.convert.placement import (
    cfs_plan_to_proto,
    cfs_request_from_proto,
    match_request_from_proto,
    matching_to_proto,
    place_request_from_proto,
    placement_to_proto,
    replay_roles_from_proto,
    role_to_proto,
    roles_request_from_proto,
)
from planner.service.errors import InvalidArgumentError
from planner.service.role_oracles import RoleOracles
from planner.solvers import SolverError
from planner.v1 import placement_pb2


def classify_roles_rpc(
    msg: placement_pb2.ClassifyRolesRequest, oracles: RoleOracles | None
) -> placement_pb2.ClassifyRolesResponse:
    profiles, config = roles_request_from_proto(msg, oracles)
    replay = replay_roles_from_proto(msg)
    decisions = []
    for p in profiles:
        name = replay.profiles.get(p.id)
        if name is None:
            decisions.append(classify(p, config))
        else:
            assert oracles is not None  # roles_request_from_proto refuses it otherwise
            slo = Slo(ttft_s=p.slo_ttft_s, tbt_s=p.slo_tbt_s)
            oracle = oracles.oracle(name, slo, replay.duration_s, replay.seed)
            decisions.append(classify(p, config, oracle=oracle, attainment=replay.attainment))
    return placement_pb2.ClassifyRolesResponse(decisions=[role_to_proto(d) for d in decisions])


def place_models_rpc(
    msg: placement_pb2.PlaceModelsRequest, time_remaining_s: float | None
) -> placement_pb2.PlaceModelsResponse:
    inputs, backend, limit, gap = place_request_from_proto(msg, time_remaining_s)
    try:
        placement = place_models(inputs, limit, backend, gap)
    except SolverError as exc:  # e.g. too large to enumerate exhaustively
        raise InvalidArgumentError("solver.backend", str(exc)) from None
    except ValueError as exc:
        raise InvalidArgumentError("models", str(exc)) from None
    return placement_to_proto(inputs, placement, limit)


def match_producers_rpc(
    msg: placement_pb2.MatchProducersRequest,
) -> placement_pb2.MatchProducersResponse:
    servers = match_request_from_proto(msg)
    return placement_pb2.MatchProducersResponse(
        servers=[matching_to_proto(sid, match_server(gpus)) for sid, gpus in servers]
    )


def partition_batch_rpc(
    msg: placement_pb2.PartitionBatchRequest,
) -> placement_pb2.PartitionBatchResponse:
    return cfs_plan_to_proto(partition_batch(cfs_request_from_proto(msg)))
