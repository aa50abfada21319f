"""PlacementService through a real gRPC server on loopback: roles, placement,
matching, and the lease ledger (idempotent retries, refused calls answered
FAILED_PRECONDITION, bad input INVALID_ARGUMENT naming the field, concurrent
allocations never over-committing a producer), plus `planner call`."""

from __future__ import annotations

import json
import threading

import grpc
import pytest

from planner import cli
from planner.service.errors import FailedPreconditionError
from planner.service.placement_methods import classify_roles_rpc
from planner.v1 import common_pb2, placement_pb2_grpc, solver_pb2
from planner.v1 import placement_pb2 as pb

GB = 10**9


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> placement_pb2_grpc.PlacementServiceStub:
    return placement_pb2_grpc.PlacementServiceStub(channel)


def code_of(call, request) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=10)
    return info.value.code(), info.value.details()


def test_classify_roles(stub):
    answer = stub.ClassifyRoles(
        pb.ClassifyRolesRequest(
            deployments=[
                pb.DeploymentProfile(
                    id="sd3",
                    gpu_memory_bytes=80 * GB,
                    batch_curve=[
                        pb.BatchProfilePoint(batch_size=b, throughput=t, used_bytes=u * GB)
                        for b, t, u in [(1, 1.0, 20), (8, 5.0, 50), (16, 5.1, 70)]
                    ],
                ),
                pb.DeploymentProfile(
                    id="yi",
                    gpu_memory_bytes=80 * GB,
                    rate_curve=[
                        pb.RateProfilePoint(rate_rps=1, ttft_s=0.3, tbt_s=0.05, used_bytes=75 * GB),
                        pb.RateProfilePoint(rate_rps=3, ttft_s=2.0, tbt_s=0.05, used_bytes=78 * GB),
                    ],
                    swap_demand_bytes=15 * GB,
                ),
            ]
        ),
        timeout=10,
    )
    sd3, yi = answer.decisions
    assert sd3.role == pb.DEPLOYMENT_ROLE_PRODUCER and sd3.r_bytes == 30 * GB
    assert sd3.batch_size == 8
    assert yi.role == pb.DEPLOYMENT_ROLE_CONSUMER and yi.r_bytes == -15 * GB
    assert 1 <= yi.sustainable_rate_rps < 3 and yi.probes_rps


def test_classify_roles_with_the_replay_oracle(stub):
    answer = stub.ClassifyRoles(
        pb.ClassifyRolesRequest(
            deployments=[
                pb.DeploymentProfile(
                    id="llama8b",
                    gpu_memory_bytes=141 * GB,
                    replay_profile="llama-3-8b@h200-sxm-141gb",
                ),
                pb.DeploymentProfile(
                    id="qwen32b",
                    gpu_memory_bytes=80 * GB,
                    replay_profile="qwen2.5-32b@h100-sxm-80gb",
                    swap_demand_bytes=20 * GB,
                ),
            ],
            params=pb.RoleParams(replay_duration_s=10),
        ),
        timeout=30,
    )
    small, big = answer.decisions
    assert small.role == pb.DEPLOYMENT_ROLE_PRODUCER and small.free_bytes > 50 * GB
    assert small.sustainable_rate_rps > 4 and small.probes_rps[0] == 0.5
    assert big.role == pb.DEPLOYMENT_ROLE_CONSUMER and big.r_bytes == -20 * GB


def test_replay_roles_need_a_service_handed_the_oracle():
    # The service does not import the replay: one started without its oracle
    # refuses a deployment named by a profile, naming the field.
    request = _replay("llama-3-8b@h200-sxm-141gb")
    with pytest.raises(FailedPreconditionError) as info:
        classify_roles_rpc(request, None)
    assert info.value.field == "deployments[0].replay_profile"


def _replay(name: str = "llama-3-8b@h100", **params) -> pb.ClassifyRolesRequest:
    return pb.ClassifyRolesRequest(
        deployments=[pb.DeploymentProfile(id="d", gpu_memory_bytes=GB, replay_profile=name)],
        params=pb.RoleParams(**params),
    )


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (_replay("llama-3-8b"), "deployments[0].replay_profile"),
        (_replay("nope@h100"), "deployments[0].replay_profile"),
        (_replay("llama-3-8b@/etc/passwd"), "deployments[0].replay_profile"),
        (_replay("llama-3-70b@h100-sxm-80gb"), "deployments[0].replay_profile"),
        (_replay(attainment=0), "params.attainment"),
        (_replay(attainment=1.5), "params.attainment"),
        (_replay(replay_duration_s=0), "params.replay_duration_s"),
        (_replay(replay_duration_s=1e6), "params.replay_duration_s"),
        (_replay(replay_seed=-1), "params.replay_seed"),
        (
            pb.ClassifyRolesRequest(
                deployments=[
                    pb.DeploymentProfile(
                        id="d",
                        gpu_memory_bytes=GB,
                        replay_profile="llama-3-8b@h100",
                        rate_curve=[pb.RateProfilePoint(rate_rps=1, ttft_s=0.1, tbt_s=0.01)],
                    )
                ]
            ),
            "deployments[0]",
        ),
    ],
)
def test_bad_replay_roles_input_names_the_field(stub, request_, field):
    code, detail = code_of(stub.ClassifyRoles, request_)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and detail.startswith(f"{field}:")


def test_place_then_match(stub):
    request = pb.PlaceModelsRequest(
        models=[
            pb.ModelToPlace(id="audiogen", r_bytes=20 * GB),
            pb.ModelToPlace(id="llama70b", r_bytes=-15 * GB, shards=2),
            pb.ModelToPlace(id="sd3", r_bytes=10 * GB),
            pb.ModelToPlace(id="yi34b", r_bytes=-12 * GB),
            pb.ModelToPlace(id="llama8b", r_bytes=5 * GB, shards=2),
            pb.ModelToPlace(id="opt30b", r_bytes=-8 * GB),
        ],
        num_servers=3,
        gpus_per_server=4,
        gpu_memory_bytes=80 * GB,
    )
    placed = stub.PlaceModels(request, timeout=30)
    assert placed.stats.status == solver_pb2.SOLVE_STATUS_OPTIMAL
    assert placed.stats.backend == common_pb2.SOLVER_BACKEND_CP_SAT
    assert placed.objective_bytes == 10 * GB and not placed.fallback
    assert [load.eq for load in placed.loads] == [0, 0, 0]
    assert sum(load.gpus_used for load in placed.loads) == 8
    exhaustive = pb.PlaceModelsRequest()
    exhaustive.CopyFrom(request)
    exhaustive.solver.backend = common_pb2.SOLVER_BACKEND_EXHAUSTIVE
    assert stub.PlaceModels(exhaustive, timeout=30).objective_bytes == 10 * GB
    # Match on one server: the consumer gets the producer.
    matched = stub.MatchProducers(
        pb.MatchProducersRequest(
            servers=[
                pb.ServerGpus(
                    server_id="s0",
                    gpus=[
                        pb.SharingGpu(id="a0", spare_bytes=20 * GB, link_gbps=300),
                        pb.SharingGpu(id="l0", demand_bytes=8 * GB, link_gbps=300, paging_gbps=40),
                        pb.SharingGpu(id="l1", demand_bytes=8 * GB, link_gbps=300),
                    ],
                )
            ]
        ),
        timeout=10,
    )
    (server,) = matched.servers
    assert [(p.producer_id, p.consumer_id) for p in server.pairs] == [("a0", "l0")]
    assert server.pairs[0].headroom_gbps == 260
    assert list(server.dram_consumer_ids) == ["l1"]


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (
            pb.PlaceModelsRequest(num_servers=0, gpus_per_server=8, gpu_memory_bytes=GB),
            "num_servers",
        ),
        (
            pb.PlaceModelsRequest(
                num_servers=1,
                gpus_per_server=2,
                gpu_memory_bytes=GB,
                models=[pb.ModelToPlace(id="m", shards=3)],
            ),
            "models[0].shards",
        ),
        (
            pb.PlaceModelsRequest(
                num_servers=1,
                gpus_per_server=2,
                gpu_memory_bytes=GB,
                models=[pb.ModelToPlace(id="m"), pb.ModelToPlace(id="m")],
            ),
            "models[1].id",
        ),
    ],
)
def test_bad_placement_input_names_the_field(stub, request_, field):
    code, detail = code_of(stub.PlaceModels, request_)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and detail.startswith(f"{field}:")


def test_ledger_round_trip_and_idempotency(stub):
    pool = "pool-rt"
    offer = pb.OfferMemoryRequest(
        pool_id=pool, idempotency_key="o1", producer_id="gpu0", server_id="s0", bytes=10 * GB
    )
    first = stub.OfferMemory(offer, timeout=10)
    assert first.producer.offered_bytes == 10 * GB and first.revision == 1
    assert not first.replayed
    again = stub.OfferMemory(offer, timeout=10)  # a retry: same answer, no change
    assert again.replayed and again.revision == 1
    assert again.producer == first.producer
    changed = pb.OfferMemoryRequest()
    changed.CopyFrom(offer)
    changed.bytes = 11 * GB
    code, detail = code_of(stub.OfferMemory, changed)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and detail.startswith("idempotency_key:")

    alloc = stub.AllocateMemory(
        pb.AllocateMemoryRequest(
            pool_id=pool, idempotency_key="a1", consumer_id="gpu1", bytes=6 * GB, now_s=1.0
        ),
        timeout=10,
    )
    assert alloc.granted and alloc.lease.producer_id == "gpu0"
    assert alloc.producer.free_bytes == 4 * GB
    short = stub.AllocateMemory(
        pb.AllocateMemoryRequest(
            pool_id=pool, idempotency_key="a2", consumer_id="gpu2", bytes=6 * GB, now_s=1.0
        ),
        timeout=10,
    )
    assert not short.granted and "no producer has" in short.reason  # -> DRAM

    reclaim = stub.ReclaimMemory(
        pb.ReclaimMemoryRequest(
            pool_id=pool,
            idempotency_key="r1",
            producer_id="gpu0",
            bytes=8 * GB,
            now_s=2.0,
            grace_s=0.5,
        ),
        timeout=10,
    )
    assert reclaim.returned_bytes == 4 * GB and reclaim.reclaim.outstanding_bytes == 4 * GB
    assert [x.lease_id for x in reclaim.revoked] == [alloc.lease.lease_id]
    assert reclaim.revoked[0].state == pb.LEASE_STATE_REVOKING
    assert reclaim.revoked[0].deadline_s == 2.5
    status = stub.GetPoolStatus(
        pb.GetPoolStatusRequest(pool_id=pool, consumer_id="gpu1", now_s=3.0), timeout=10
    )
    assert status.found and list(status.overdue_lease_ids) == [alloc.lease.lease_id]
    assert status.leases[0].state == pb.LEASE_STATE_REVOKING
    (acct,) = status.producers
    assert acct.offered_bytes == 6 * GB and acct.leased_bytes == 6 * GB
    assert acct.reclaim_outstanding_bytes == 4 * GB

    free = pb.FreeMemoryRequest(pool_id=pool, idempotency_key="f1", lease_id=alloc.lease.lease_id)
    freed = stub.FreeMemory(free, timeout=10)
    assert freed.returned_bytes == 4 * GB
    assert freed.producer.offered_bytes == 2 * GB and freed.producer.leased_bytes == 0
    assert stub.FreeMemory(free, timeout=10).replayed
    # Freeing it again under a new key: refused, nothing changes.
    code, detail = code_of(
        stub.FreeMemory,
        pb.FreeMemoryRequest(pool_id=pool, idempotency_key="f2", lease_id=alloc.lease.lease_id),
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION and detail.startswith("lease_id:")
    after = stub.GetPoolStatus(pb.GetPoolStatusRequest(pool_id=pool), timeout=10)
    assert after.revision == freed.revision
    assert after.reclaims[0].complete
    # The refused call did not use up its key.
    stub.OfferMemory(
        pb.OfferMemoryRequest(pool_id=pool, idempotency_key="f2", producer_id="gpu0", bytes=GB),
        timeout=10,
    )


@pytest.mark.parametrize(
    ("method", "request_", "field"),
    [
        (
            "OfferMemory",
            pb.OfferMemoryRequest(idempotency_key="k", producer_id="p", bytes=1),
            "pool_id",
        ),
        (
            "OfferMemory",
            pb.OfferMemoryRequest(pool_id="x", producer_id="p", bytes=1),
            "idempotency_key",
        ),
        (
            "OfferMemory",
            pb.OfferMemoryRequest(pool_id="x", idempotency_key="k", producer_id="p"),
            "bytes",
        ),
        (
            "AllocateMemory",
            pb.AllocateMemoryRequest(pool_id="x", idempotency_key="k", consumer_id="c", bytes=-1),
            "bytes",
        ),
        (
            "ReclaimMemory",
            pb.ReclaimMemoryRequest(pool_id="x", idempotency_key="k", producer_id="p", grace_s=-1),
            "grace_s",
        ),
        ("FreeMemory", pb.FreeMemoryRequest(pool_id="x", idempotency_key="k"), "lease_id"),
    ],
)
def test_bad_ledger_input_names_the_field(stub, method, request_, field):
    code, detail = code_of(getattr(stub, method), request_)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and detail.startswith(f"{field}:")


def test_concurrent_allocations_never_over_commit(stub):
    pool = "pool-concurrent"
    for p in range(3):
        stub.OfferMemory(
            pb.OfferMemoryRequest(
                pool_id=pool, idempotency_key=f"o{p}", producer_id=f"p{p}", bytes=10 * GB
            ),
            timeout=10,
        )
    granted: list[pb.AllocateMemoryResponse] = []
    lock = threading.Lock()

    def worker(w: int) -> None:
        for i in range(8):
            key = f"w{w}-{i}"
            req = pb.AllocateMemoryRequest(
                pool_id=pool, idempotency_key=key, consumer_id=f"c{w}", bytes=GB, now_s=float(i)
            )
            out = stub.AllocateMemory(req, timeout=30)
            # A retry racing with other threads answers the same.
            assert stub.AllocateMemory(req, timeout=30).lease == out.lease
            with lock:
                granted.append(out)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    leases = [g.lease.lease_id for g in granted if g.granted]
    assert len(leases) == 30 and len(set(leases)) == 30  # 30 GB offered, 48 asked
    status = stub.GetPoolStatus(pb.GetPoolStatusRequest(pool_id=pool), timeout=10)
    assert all(p.leased_bytes == p.offered_bytes == 10 * GB for p in status.producers)
    assert len(status.leases) == 30


def test_planner_call_ledger_with_a_store(tmp_path, capsys, store_location):
    store = store_location
    offer = tmp_path / "offer.json"
    offer.write_text(
        json.dumps({"pool_id": "cli", "idempotency_key": "o", "producer_id": "p", "bytes": "5"}),
        encoding="utf-8",
    )
    args = ["call", "PlacementService.OfferMemory", "--json", str(offer), "--store", str(store)]
    assert cli.main(args) == 0
    assert json.loads(capsys.readouterr().out)["revision"] == "1"
    assert cli.main(args) == 0  # the retry replays
    assert json.loads(capsys.readouterr().out)["replayed"] is True
    free = tmp_path / "free.json"
    free.write_text(
        '{"pool_id": "cli", "idempotency_key": "f", "lease_id": "lease-9"}', encoding="utf-8"
    )
    call = ["call", "PlacementService.FreeMemory", "--json", str(free), "--store", str(store)]
    assert cli.main(call) == 1
    assert "FAILED_PRECONDITION: lease_id:" in capsys.readouterr().err


def test_partition_batch(stub):
    answer = stub.PartitionBatch(
        pb.PartitionBatchRequest(
            requests=[
                pb.CfsRequest(
                    id="A",
                    prompt_tokens=32,
                    prefilled_tokens=32,
                    generated_tokens=40,
                    resident=True,
                ),
                pb.CfsRequest(
                    id="B", prompt_tokens=32, prefilled_tokens=32, generated_tokens=8, resident=True
                ),
                pb.CfsRequest(id="C", prompt_tokens=32, arrival_s=1.0),
                pb.CfsRequest(id="D", prompt_tokens=32, arrival_s=1.0),
            ],
            token_budget=66,
            gpu_blocks=9,
            iteration=5,
        ),
        timeout=10,
    )
    assert list(answer.decode_ids) == ["B", "A"]
    assert [(c.id, c.tokens) for c in answer.prefill_chunks] == [("C", 16)]
    assert list(answer.page_in_ids) == ["C"] and answer.blocks_used == 9
    assert answer.next_reschedule_iteration == 13
    code, detail = code_of(
        stub.PartitionBatch,
        pb.PartitionBatchRequest(
            requests=[pb.CfsRequest(id="x", prompt_tokens=4, prefilled_tokens=5)], token_budget=8
        ),
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert detail.startswith("requests[0].prefilled_tokens:")
