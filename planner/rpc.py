"""The planner's RPCs as the contract names them: service, method, message
types. Clients and the server both read this table; it knows no handlers."""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import Message

from planner.v1 import (
    cluster_pb2,
    info_pb2,
    offload_pb2,
    placement_pb2,
    rotation_pb2,
    serverless_pb2,
)

PACKAGE = "planner.v1"


@dataclass(frozen=True, slots=True)
class Rpc:
    service: str
    name: str
    request_type: type[Message]
    response_type: type[Message]

    @property
    def short_name(self) -> str:
        """As on the command line: Service.Method."""
        return f"{self.service}.{self.name}"

    @property
    def full_service(self) -> str:
        return f"{PACKAGE}.{self.service}"

    @property
    def full_path(self) -> str:
        """As on the wire: /package.Service/Method."""
        return f"/{self.full_service}/{self.name}"


RPCS: dict[str, Rpc] = {
    r.short_name: r
    for r in (
        Rpc(
            "RotationService",
            "PlanRotation",
            rotation_pb2.PlanRotationRequest,
            rotation_pb2.PlanRotationResponse,
        ),
        Rpc(
            "OffloadService",
            "PlanLayerOffload",
            offload_pb2.PlanLayerOffloadRequest,
            offload_pb2.PlanLayerOffloadResponse,
        ),
        Rpc(
            "OffloadService",
            "ReportStep",
            offload_pb2.ReportStepRequest,
            offload_pb2.ReportStepResponse,
        ),
        Rpc(
            "ClusterService",
            "PlanBuddyGroups",
            cluster_pb2.PlanBuddyGroupsRequest,
            cluster_pb2.PlanBuddyGroupsResponse,
        ),
        Rpc(
            "ClusterService",
            "EvaluateDropTrigger",
            cluster_pb2.EvaluateDropTriggerRequest,
            cluster_pb2.EvaluateDropTriggerResponse,
        ),
        Rpc(
            "ClusterService",
            "DecideRestore",
            cluster_pb2.DecideRestoreRequest,
            cluster_pb2.DecideRestoreResponse,
        ),
        Rpc(
            "ClusterService",
            "GetClusterState",
            cluster_pb2.GetClusterStateRequest,
            cluster_pb2.GetClusterStateResponse,
        ),
        Rpc(
            "PlacementService",
            "ClassifyRoles",
            placement_pb2.ClassifyRolesRequest,
            placement_pb2.ClassifyRolesResponse,
        ),
        Rpc(
            "PlacementService",
            "PlaceModels",
            placement_pb2.PlaceModelsRequest,
            placement_pb2.PlaceModelsResponse,
        ),
        Rpc(
            "PlacementService",
            "MatchProducers",
            placement_pb2.MatchProducersRequest,
            placement_pb2.MatchProducersResponse,
        ),
        Rpc(
            "PlacementService",
            "OfferMemory",
            placement_pb2.OfferMemoryRequest,
            placement_pb2.OfferMemoryResponse,
        ),
        Rpc(
            "PlacementService",
            "AllocateMemory",
            placement_pb2.AllocateMemoryRequest,
            placement_pb2.AllocateMemoryResponse,
        ),
        Rpc(
            "PlacementService",
            "FreeMemory",
            placement_pb2.FreeMemoryRequest,
            placement_pb2.FreeMemoryResponse,
        ),
        Rpc(
            "PlacementService",
            "ReclaimMemory",
            placement_pb2.ReclaimMemoryRequest,
            placement_pb2.ReclaimMemoryResponse,
        ),
        Rpc(
            "PlacementService",
            "GetPoolStatus",
            placement_pb2.GetPoolStatusRequest,
            placement_pb2.GetPoolStatusResponse,
        ),
        Rpc(
            "PlacementService",
            "PartitionBatch",
            placement_pb2.PartitionBatchRequest,
            placement_pb2.PartitionBatchResponse,
        ),
        Rpc(
            "ServerlessService",
            "PlanModelPlacement",
            serverless_pb2.PlanModelPlacementRequest,
            serverless_pb2.PlanModelPlacementResponse,
        ),
        Rpc(
            "ServerlessService",
            "Route",
            serverless_pb2.RouteRequest,
            serverless_pb2.RouteResponse,
        ),
        Rpc(
            "ServerlessService",
            "ScheduleWaiting",
            serverless_pb2.ScheduleWaitingRequest,
            serverless_pb2.ScheduleWaitingResponse,
        ),
        Rpc(
            "ServerlessService",
            "ChooseChunkSize",
            serverless_pb2.ChooseChunkSizeRequest,
            serverless_pb2.ChooseChunkSizeResponse,
        ),
        Rpc(
            "ServerlessService",
            "ChooseKernel",
            serverless_pb2.ChooseKernelRequest,
            serverless_pb2.ChooseKernelResponse,
        ),
        Rpc(
            "ServerlessService",
            "ReportKnobFeedback",
            serverless_pb2.ReportKnobFeedbackRequest,
            serverless_pb2.ReportKnobFeedbackResponse,
        ),
        Rpc(
            "ServerlessService",
            "GetKnobState",
            serverless_pb2.GetKnobStateRequest,
            serverless_pb2.GetKnobStateResponse,
        ),
        Rpc(
            "PlannerInfoService",
            "GetPlannerInfo",
            info_pb2.GetPlannerInfoRequest,
            info_pb2.GetPlannerInfoResponse,
        ),
    )
}

SERVICE_NAMES = sorted({r.full_service for r in RPCS.values()})
