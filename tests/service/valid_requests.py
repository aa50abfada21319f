"""One valid request per RPC of planner.rpc, taken from the service tests:
the seeds the fuzz tests mutate and the calls that prove a server still
serves. Ids of stateful RPCs (pool, cluster, engine, gpu) are FUZZ_* so the
fuzz tests can read that state back."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from google.protobuf import json_format
from google.protobuf.message import Message

from planner.v1 import (
    cluster_pb2,
    common_pb2,
    info_pb2,
    offload_pb2,
    placement_pb2,
    rotation_pb2,
    serverless_pb2,
)

ROTATION_EXAMPLE = Path(__file__).resolve().parents[2] / "fixtures/rotation/example_request.json"
GB = 10**9
POOL = "fuzz-pool"
CLUSTER = "fuzz-cluster"
ENGINE = "fuzz-engine"
GPU = "fuzz-gpu"
C = cluster_pb2
P = placement_pb2
S = serverless_pb2


def _rotation() -> Message:
    text = ROTATION_EXAMPLE.read_text(encoding="utf-8")
    return json_format.Parse(text, rotation_pb2.PlanRotationRequest())


def _offload() -> Message:
    return offload_pb2.PlanLayerOffloadRequest(
        engine_id=ENGINE,
        step=5,
        requests=[
            offload_pb2.DecodeRequest(id="long", num_tokens=3000, deposited_tokens=2),
            offload_pb2.DecodeRequest(id="short", num_tokens=500),
        ],
        layer_compute_s=[0.002] * 8,
        link_blocks_per_s=20_000,
        gpu_block_budget=1400,
        slo=common_pb2.Slo(tbt_s=0.1),
    )


def _buddy() -> Message:
    return C.PlanBuddyGroupsRequest(
        cluster_id=CLUSTER,
        instances=[
            C.ClusterInstance(id=f"i{j}", kv_capacity_bytes=40 * GB, kv_demand_bytes=d * GB)
            for j, d in enumerate([70, 20, 55, 35, 10, 45, 60, 30])
        ],
        param_bytes=28 * GB,
        num_layers=48,
        group_throughput=[1.0, 1.8, 2.5, 3.1, 3.6, 4.0, 4.3, 4.5],
    )


def _trigger() -> Message:
    return C.EvaluateDropTriggerRequest(
        cluster_id=CLUSTER,
        now_s=1.0,
        instances=[
            C.InstanceMemory(instance_id="a", kv_used_bytes=70 * GB, hbm_available_bytes=80 * GB),
            C.InstanceMemory(instance_id="b", kv_used_bytes=10 * GB, hbm_available_bytes=80 * GB),
        ],
    )


def _restore() -> Message:
    return C.DecideRestoreRequest(
        cluster_id=CLUSTER,
        now_s=2.0,
        instances=[
            C.InstanceDemand(instance_id=x, kv_demand_bytes=20 * GB, kv_capacity_bytes=40 * GB)
            for x in (f"i{j}" for j in range(8))
        ],
        params=C.RestoreParams(hold_s=2.0),
    )


def _classify() -> Message:
    return P.ClassifyRolesRequest(
        deployments=[
            P.DeploymentProfile(
                id="sd3",
                gpu_memory_bytes=80 * GB,
                batch_curve=[
                    P.BatchProfilePoint(batch_size=b, throughput=t, used_bytes=u * GB)
                    for b, t, u in [(1, 1.0, 20), (8, 5.0, 50), (16, 5.1, 70)]
                ],
            ),
            P.DeploymentProfile(
                id="yi",
                gpu_memory_bytes=80 * GB,
                rate_curve=[
                    P.RateProfilePoint(rate_rps=1, ttft_s=0.3, tbt_s=0.05, used_bytes=75 * GB),
                    P.RateProfilePoint(rate_rps=3, ttft_s=2.0, tbt_s=0.05, used_bytes=78 * GB),
                ],
                swap_demand_bytes=15 * GB,
            ),
        ]
    )


def _place() -> Message:
    return P.PlaceModelsRequest(
        models=[
            P.ModelToPlace(id="audiogen", r_bytes=20 * GB),
            P.ModelToPlace(id="llama70b", r_bytes=-15 * GB, shards=2),
            P.ModelToPlace(id="sd3", r_bytes=10 * GB),
            P.ModelToPlace(id="yi34b", r_bytes=-12 * GB),
        ],
        num_servers=2,
        gpus_per_server=4,
        gpu_memory_bytes=80 * GB,
    )


def _match() -> Message:
    return P.MatchProducersRequest(
        servers=[
            P.ServerGpus(
                server_id="s0",
                gpus=[
                    P.SharingGpu(id="a0", spare_bytes=20 * GB, link_gbps=300),
                    P.SharingGpu(id="l0", demand_bytes=8 * GB, link_gbps=300, paging_gbps=40),
                    P.SharingGpu(id="l1", demand_bytes=8 * GB, link_gbps=300),
                ],
            )
        ]
    )


def _partition() -> Message:
    return P.PartitionBatchRequest(
        requests=[
            P.CfsRequest(
                id="A", prompt_tokens=32, prefilled_tokens=32, generated_tokens=40, resident=True
            ),
            P.CfsRequest(
                id="B", prompt_tokens=32, prefilled_tokens=32, generated_tokens=8, resident=True
            ),
            P.CfsRequest(id="C", prompt_tokens=32, arrival_s=1.0),
        ],
        token_budget=64,
        gpu_blocks=100,
    )


def _serverless_placement() -> Message:
    return S.PlanModelPlacementRequest(
        models=[
            S.ServerlessModelSpec(name="x", weight_bytes=15 * GB, tpot_s=0.1, weight=2.0),
            S.ServerlessModelSpec(name="y", weight_bytes=15 * GB, tpot_s=0.1, weight=2.0),
        ],
        slices=[S.MigSliceSpec(id=f"s{i}", profile_name="gh200-3x24gb") for i in range(2)],
        link=S.C2cLink(link_gbps=405.0),
    )


def _route() -> Message:
    return S.RouteRequest(
        model=S.ServerlessModelSpec(name="m", weight_bytes=10 * GB, tpot_s=0.1),
        priority=2.0,
        slices=[
            S.SliceStatus(
                slice=S.MigSliceSpec(id="a", profile_name="7"),
                model="old",
                model_c2c_gbps=300,
                last_used_s=1.0,
            ),
            S.SliceStatus(slice=S.MigSliceSpec(id="b", profile_name="7")),
        ],
    )


def _schedule_waiting() -> Message:
    return S.ScheduleWaitingRequest(
        waiting=[
            S.WaitingModelSpec(
                model=S.ServerlessModelSpec(name="m", weight_bytes=10 * GB, tpot_s=0.25),
                priority=1.0,
                waiting_since_s=1.0,
                requests=2,
                slack_s=0.5,
            )
        ],
        slices=[
            S.SliceStatus(
                slice=S.MigSliceSpec(id="a", profile_name="3"),
                model="old",
                model_c2c_gbps=40,
                model_priority=1.0,
                in_flight=3,
                active_since_s=0.0,
                slack_s=30.0,
            )
        ],
        now_s=5.0,
        preemption=S.Preemption(
            min_hold_s=1.0, urgent_slack_s=1.0, victim_slack_s=10.0, starve_after_s=20.0
        ),
        max_models_per_slice=2,
    )


def _chunk() -> Message:
    return S.ChooseChunkSizeRequest(
        model_name="llama-3-8b",
        slice=S.MigSliceSpec(id="a", profile_name="gh200-7x12gb"),
        ttft_target_s=2.0,
        prompt_tokens=2048,
        c2c_gbps=58.0,
    )


VALID: dict[str, Callable[[], Message]] = {
    "RotationService.PlanRotation": _rotation,
    "OffloadService.PlanLayerOffload": _offload,
    "OffloadService.ReportStep": lambda: offload_pb2.ReportStepRequest(
        engine_id=ENGINE, step=6, observed_step_s=0.02, batch_ids=["long", "short"]
    ),
    "ClusterService.PlanBuddyGroups": _buddy,
    "ClusterService.EvaluateDropTrigger": _trigger,
    "ClusterService.DecideRestore": _restore,
    "ClusterService.GetClusterState": lambda: C.GetClusterStateRequest(cluster_id=CLUSTER),
    "PlacementService.ClassifyRoles": _classify,
    "PlacementService.PlaceModels": _place,
    "PlacementService.MatchProducers": _match,
    "PlacementService.OfferMemory": lambda: P.OfferMemoryRequest(
        pool_id=POOL, idempotency_key="o1", producer_id="gpu0", server_id="s0", bytes=10 * GB
    ),
    "PlacementService.AllocateMemory": lambda: P.AllocateMemoryRequest(
        pool_id=POOL, idempotency_key="a1", consumer_id="gpu1", bytes=6 * GB, now_s=1.0
    ),
    "PlacementService.FreeMemory": lambda: P.FreeMemoryRequest(
        pool_id=POOL, idempotency_key="f1", lease_id="lease-1"
    ),
    "PlacementService.ReclaimMemory": lambda: P.ReclaimMemoryRequest(
        pool_id=POOL, idempotency_key="r1", producer_id="gpu0", bytes=2 * GB, now_s=2.0, grace_s=0.5
    ),
    "PlacementService.GetPoolStatus": lambda: P.GetPoolStatusRequest(pool_id=POOL, now_s=3.0),
    "PlacementService.PartitionBatch": _partition,
    "ServerlessService.PlanModelPlacement": _serverless_placement,
    "ServerlessService.Route": _route,
    "ServerlessService.ScheduleWaiting": _schedule_waiting,
    "ServerlessService.ChooseChunkSize": _chunk,
    "ServerlessService.ChooseKernel": lambda: S.ChooseKernelRequest(
        tokens=2048,
        slice=S.MigSliceSpec(id="t0", profile_name="3"),
        model_name="llama-3-8b",
        gpu_id=GPU,
    ),
    "ServerlessService.ReportKnobFeedback": lambda: S.ReportKnobFeedbackRequest(
        gpu_id=GPU,
        slice_id="t0",
        now_s=1.0,
        latency_s=0.01,
        latency_budget_s=0.02,
        hbm_util=1.0,
        c2c_util=0.2,
    ),
    "ServerlessService.GetKnobState": lambda: S.GetKnobStateRequest(gpu_id=GPU),
    "PlannerInfoService.GetPlannerInfo": info_pb2.GetPlannerInfoRequest,
}
