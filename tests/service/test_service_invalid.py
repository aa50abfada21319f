"""Bad input over gRPC: INVALID_ARGUMENT naming the field, and the server
keeps serving."""

from __future__ import annotations

import math
from collections.abc import Callable

import grpc
import pytest

from planner.service.limits import ServiceLimits
from planner.v1 import common_pb2, rotation_pb2

PLAN = "RotationService.PlanRotation"
Request = rotation_pb2.PlanRotationRequest
Mutation = Callable[[Request], object]


def assert_serving(channel: grpc.Channel, stub, request: Request) -> None:
    """A valid call right after a refused one is answered with a plan."""
    response = stub(channel, PLAN)(request, timeout=10)
    assert [d.id for d in response.plan.prioritized] == ["a", "c"]


def assert_invalid(channel: grpc.Channel, stub, request: Request, field: str) -> str:
    with pytest.raises(grpc.RpcError) as err:
        stub(channel, PLAN)(request, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    details = err.value.details()
    # "<field path>: <reason>"
    assert details.startswith(f"{field}: "), details
    assert len(details) > len(field) + 2
    return details


def _set(path: str, value: object) -> Mutation:
    """Set a dotted attribute path (requests[i] allowed) on the request."""

    def mutate(r: Request) -> None:
        *parents, last = path.split(".")
        obj: object = r
        for part in parents:
            if part.endswith("]"):
                name, index = part[:-1].split("[")
                obj = getattr(obj, name)[int(index)]
            else:
                obj = getattr(obj, part)
        setattr(obj, last, value)

    return mutate


def _clear(index: int, name: str) -> Mutation:
    return lambda r: r.snapshot.requests[index].ClearField(name)


# Example request: requests[0] "a" WAITING, [1] "b" RUNNING, [2] "c" ROTARY,
# now_s 10.
COUNTS_CASES: list[tuple[str, Mutation, str]] = [
    ("missing_snapshot", lambda r: r.ClearField("snapshot"), "snapshot"),
    ("negative_free_gpu", _set("snapshot.free_gpu_blocks", -1), "snapshot.free_gpu_blocks"),
    ("negative_free_cpu", _set("snapshot.free_cpu_blocks", -3), "snapshot.free_cpu_blocks"),
    (
        "negative_prompt",
        _set("snapshot.requests[0].prompt_blocks", -5),
        "snapshot.requests[0].prompt_blocks",
    ),
    (
        "zero_prompt_waiting",
        _set("snapshot.requests[0].prompt_blocks", 0),
        "snapshot.requests[0].prompt_blocks",
    ),
    (
        "negative_gpu",
        _set("snapshot.requests[1].gpu_blocks", -1),
        "snapshot.requests[1].gpu_blocks",
    ),
    (
        "negative_cpu",
        _set("snapshot.requests[2].cpu_blocks", -1),
        "snapshot.requests[2].cpu_blocks",
    ),
    (
        "huge_block_count",
        _set("snapshot.requests[1].gpu_blocks", 1 << 40),
        "snapshot.requests[1].gpu_blocks",
    ),
    (
        "synced_exceeds_gpu",
        _set("snapshot.requests[1].synced_blocks", 61),
        "snapshot.requests[1].synced_blocks",
    ),
    ("empty_id", _set("snapshot.requests[1].id", ""), "snapshot.requests[1].id"),
    ("state_unspecified", _set("snapshot.requests[1].state", 0), "snapshot.requests[1].state"),
    ("state_unknown_99", _set("snapshot.requests[1].state", 99), "snapshot.requests[1].state"),
    ("slo_ttft_zero", _set("slo.ttft_s", 0.0), "slo.ttft_s"),
    ("slo_ttft_negative", _set("slo.ttft_s", -1.0), "slo.ttft_s"),
    ("slo_tbt_zero", _set("slo.tbt_s", 0.0), "slo.tbt_s"),
    ("slo_tbt_nan", _set("slo.tbt_s", math.nan), "slo.tbt_s"),
    ("now_nan", _set("snapshot.now_s", math.nan), "snapshot.now_s"),
    ("now_inf", _set("snapshot.now_s", math.inf), "snapshot.now_s"),
    ("now_minus_inf", _set("snapshot.now_s", -math.inf), "snapshot.now_s"),
    # Extreme finite values: refused, not left to overflow a VLT to inf.
    ("now_in_nanoseconds", _set("snapshot.now_s", 1.7e18), "snapshot.now_s"),
    (
        "arrival_far_past",
        _set("snapshot.requests[0].arrival_s", -1e300),
        "snapshot.requests[0].arrival_s",
    ),
    (
        "request_slo_beyond_a_day",
        _set("snapshot.requests[2].slo_tbt_s", 1e308),
        "snapshot.requests[2].slo_tbt_s",
    ),
    ("beta_ttft_huge", _set("params.beta_ttft", 1.7e308), "params.beta_ttft"),
    ("alpha_huge", _set("params.alpha", 1e10), "params.alpha"),
    (
        "preempt_slack_huge",
        _set("params.preempt_slack_tbts", -1e300),
        "params.preempt_slack_tbts",
    ),
    (
        "arrival_nan",
        _set("snapshot.requests[0].arrival_s", math.nan),
        "snapshot.requests[0].arrival_s",
    ),
    (
        "run_start_inf",
        _set("snapshot.requests[1].run_start_s", math.inf),
        "snapshot.requests[1].run_start_s",
    ),
    (
        "last_token_minus_inf",
        _set("snapshot.requests[2].last_token_s", -math.inf),
        "snapshot.requests[2].last_token_s",
    ),
    ("waiting_without_arrival", _clear(0, "arrival_s"), "snapshot.requests[0].arrival_s"),
    ("running_without_run_start", _clear(1, "run_start_s"), "snapshot.requests[1].run_start_s"),
    ("rotary_without_last_token", _clear(2, "last_token_s"), "snapshot.requests[2].last_token_s"),
    (
        "arrival_after_now",
        _set("snapshot.requests[0].arrival_s", 10.5),
        "snapshot.requests[0].arrival_s",
    ),
    (
        "last_token_after_now",
        _set("snapshot.requests[2].last_token_s", 11.0),
        "snapshot.requests[2].last_token_s",
    ),
    ("block_size_zero", _set("snapshot.block_size_tokens", 0), "snapshot.block_size_tokens"),
    ("last_iteration_zero", _set("snapshot.last_iteration_s", 0.0), "snapshot.last_iteration_s"),
    (
        "max_batched_tokens_zero",
        _set("snapshot.max_batched_tokens", 0),
        "snapshot.max_batched_tokens",
    ),
    (
        "max_running_requests_negative",
        _set("snapshot.max_running_requests", -1),
        "snapshot.max_running_requests",
    ),
    ("alpha_negative", _set("params.alpha", -1.0), "params.alpha"),
    ("beta_ttft_nan", _set("params.beta_ttft", math.nan), "params.beta_ttft"),
    (
        "transfer_budget_negative",
        _set("params.transfer_budget_blocks", -1),
        "params.transfer_budget_blocks",
    ),
    (
        "eager_budget_negative",
        _set("params.eager_budget_blocks", -2),
        "params.eager_budget_blocks",
    ),
    ("unknown_model", _set("profile.model_name", "no-such-model"), "profile.model_name"),
    ("unknown_hardware", _set("profile.hardware_name", "tpu-v9"), "profile.hardware_name"),
    (
        "model_profile_zero_layers",
        lambda r: r.profile.model_profile.CopyFrom(
            common_pb2.ModelProfile(num_layers=0, num_kv_heads=8, head_dim=128, kv_dtype_bytes=2)
        ),
        "profile.model_profile.num_layers",
    ),
    (
        "hardware_profile_zero_bandwidth",
        lambda r: r.profile.hardware_profile.CopyFrom(
            common_pb2.HardwareProfile(hbm_bytes=1, h2d_gbps=0.0, d2h_gbps=10.0)
        ),
        "profile.hardware_profile.h2d_gbps",
    ),
    (
        "gpu_block_ids_without_pools",
        lambda r: r.snapshot.requests[1].gpu_block_ids.extend([1, 2]),
        "snapshot.requests[1].gpu_block_ids",
    ),
    (
        "cpu_block_ids_without_pools",
        lambda r: r.snapshot.requests[2].cpu_block_ids.extend([7]),
        "snapshot.requests[2].cpu_block_ids",
    ),
]


@pytest.mark.parametrize(
    ("mutation", "field"),
    [pytest.param(m, f, id=name) for name, m, f in COUNTS_CASES],
)
def test_invalid_argument_names_the_field(channel, stub, example_request, mutation, field):
    valid = Request()
    valid.CopyFrom(example_request)
    mutation(example_request)
    assert_invalid(channel, stub, example_request, field)
    assert_serving(channel, stub, valid)


@pytest.mark.parametrize("value", [-1.0, -1e-9, math.nan, math.inf, -math.inf])
@pytest.mark.parametrize(("index", "name"), [(0, "slo_ttft_s"), (2, "slo_tbt_s")])
def test_per_request_slo_must_be_positive(channel, stub, example_request, index, name, value):
    valid = Request()
    valid.CopyFrom(example_request)
    setattr(example_request.snapshot.requests[index], name, value)
    assert_invalid(channel, stub, example_request, f"snapshot.requests[{index}].{name}")
    assert_serving(channel, stub, valid)


def test_per_request_slo_overrides_the_request_level_one(channel, stub, example_request):
    # 0 leaves the request-level SLO in force.
    example_request.snapshot.requests[0].slo_ttft_s = 0.0
    plan = stub(channel, PLAN)(example_request, timeout=10).plan
    assert plan.prioritized[0].vlt == pytest.approx(5.5)
    # a: relu(10 - 2 - 0.5 * 2) = 7.
    example_request.snapshot.requests[0].slo_ttft_s = 2.0
    example_request.snapshot.requests[2].slo_tbt_s = 0.12
    example_request.params.beta_tbt = 2.0  # c: 3 * relu(0.3 - 2 * 0.12) = 0.18
    plan = stub(channel, PLAN)(example_request, timeout=10).plan
    assert [d.id for d in plan.prioritized] == ["a", "c"]
    assert [d.vlt for d in plan.prioritized] == pytest.approx([7.0, 0.18])


def test_duplicate_id_names_both_indices(channel, stub, example_request):
    example_request.snapshot.requests[2].id = "a"
    details = assert_invalid(channel, stub, example_request, "snapshot.requests[2].id")
    assert "snapshot.requests[0]" in details
    assert "'a'" in details


def test_unknown_state_on_the_wire(channel, stub, example_request):
    """An enum number the contract does not define, as raw bytes."""
    data = example_request.SerializeToString()
    assert b"\x10\x02" in data  # requests[1].state = RUNNING (field 2, varint)
    bad = data.replace(b"\x10\x02", b"\x10\x63", 1)  # 99
    with pytest.raises(grpc.RpcError) as err:
        stub(channel, PLAN, raw=True)(bad, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("snapshot.requests[1].state: ")
    assert "99" in err.value.details()


# --- block-level snapshots ----------------------------------------------------


def block_level_request() -> Request:
    """Pools set: GPU free 0..3, CPU free 100..107. requests[0] RUNNING on GPU
    blocks 10, 11, 12 with 40 tokens (2 full blocks, block 0 SYNCED to CPU
    110), 20 tokens generated since its first at 2 s (so 6 s behind its TPOT
    SLO: lost); [1] ROTARY on CPU 120, 121; [2] WAITING."""
    r = Request()
    s = r.snapshot
    s.now_s = 10.0
    s.block_size_tokens = 16
    s.pools.free_gpu_block_ids.extend(range(4))
    s.pools.free_cpu_block_ids.extend(range(100, 108))
    run = s.requests.add(
        id="r",
        state=common_pb2.RUNNING,
        run_start_s=1.0,
        num_tokens=40,
        first_token_s=2.0,
        output_tokens=20,
    )
    run.gpu_block_ids.extend([10, 11, 12])
    run.cpu_block_ids.extend([110, -1])
    rot = s.requests.add(id="q", state=common_pb2.ROTARY, last_token_s=9.0)
    rot.cpu_block_ids.extend([120, 121])
    s.requests.add(id="w", state=common_pb2.WAITING, arrival_s=2.0, prompt_blocks=2)
    r.params.transfer_budget_blocks = 8
    return r


def test_block_level_base_is_valid(channel, stub):
    """w (3 blocks) and q (2) need 5 > 4 free. w, past its TTFT SLO, takes 3
    free blocks; q (slack unknown: lagging) displaces r, whose TPOT SLO is
    lost. r's SYNCED block 10 is released at once, its DIRTY blocks 11, 12 go
    to the CPU; q's blocks come back into free GPU blocks, none of them a
    D2H source."""
    plan = stub(channel, PLAN)(block_level_request(), timeout=10).plan
    assert not plan.fcfs_fallback
    assert [d.id for d in plan.prioritized] == ["w", "q"]
    assert [d.id for d in plan.preempted] == ["r"]
    assert list(plan.released_gpu_block_ids) == [10]
    assert list(plan.freed_after_d2h_gpu_block_ids) == [11, 12]
    moves = {(m.id, m.kind): m for m in plan.moves}
    out = moves["r", rotation_pb2.MOVE_KIND_SWAP_OUT]
    assert list(out.logical_index) == [1, 2]
    assert list(out.src_block_ids) == [11, 12]
    assert set(out.dst_block_ids) <= set(range(100, 108))
    swap_in = moves["q", rotation_pb2.MOVE_KIND_SWAP_IN]
    assert list(swap_in.src_block_ids) == [120, 121]
    assert set(swap_in.dst_block_ids) <= set(range(4))
    by_direction = {b.direction: b for b in plan.batches}
    assert by_direction[rotation_pb2.COPY_DIRECTION_H2D].num_blocks == 2
    assert by_direction[rotation_pb2.COPY_DIRECTION_D2H].num_blocks == 2
    assert not set(swap_in.dst_block_ids) & set(out.src_block_ids)


def _extend(path: Callable[[Request], object], values: list[int]) -> Mutation:
    return lambda r: path(r).extend(values)  # type: ignore[attr-defined]


def _replace(path: Callable[[Request], object], values: list[int]) -> Mutation:
    def mutate(r: Request) -> None:
        field = path(r)
        del field[:]  # type: ignore[attr-defined]
        field.extend(values)  # type: ignore[attr-defined]

    return mutate


BLOCK_CASES: list[tuple[str, Mutation, str]] = [
    (
        "gpu_blocks_disagree_with_ids",
        _set("snapshot.requests[0].gpu_blocks", 5),
        "snapshot.requests[0].gpu_blocks",
    ),
    (
        "cpu_blocks_disagree_with_ids",
        _set("snapshot.requests[1].cpu_blocks", 3),
        "snapshot.requests[1].cpu_blocks",
    ),
    (
        "free_gpu_blocks_disagree_with_pool",
        _set("snapshot.free_gpu_blocks", 7),
        "snapshot.free_gpu_blocks",
    ),
    (
        "free_cpu_blocks_disagree_with_pool",
        _set("snapshot.free_cpu_blocks", 1),
        "snapshot.free_cpu_blocks",
    ),
    (
        "gpu_block_twice_in_one_request",
        _replace(lambda r: r.snapshot.requests[0].gpu_block_ids, [10, 11, 10]),
        "snapshot.requests[0].gpu_block_ids[2]",
    ),
    (
        "gpu_block_both_free_and_owned",
        _extend(lambda r: r.snapshot.pools.free_gpu_block_ids, [11]),
        "snapshot.requests[0].gpu_block_ids[1]",
    ),
    (
        "cpu_block_owned_by_two_requests",
        _replace(lambda r: r.snapshot.requests[1].cpu_block_ids, [110, 121]),
        "snapshot.requests[1].cpu_block_ids[0]",
    ),
    (
        "cpu_copy_of_non_full_block",
        _replace(lambda r: r.snapshot.requests[0].cpu_block_ids, [110, 111, 112]),
        "snapshot.requests[0].cpu_block_ids[2]",
    ),
    (
        "more_cpu_entries_than_gpu_blocks",
        _replace(lambda r: r.snapshot.requests[0].cpu_block_ids, [110, -1, -1, -1]),
        "snapshot.requests[0].cpu_block_ids",
    ),
    (
        "negative_gpu_block_id",
        _replace(lambda r: r.snapshot.requests[0].gpu_block_ids, [10, -1, 12]),
        "snapshot.requests[0].gpu_block_ids[1]",
    ),
    (
        "negative_free_cpu_block_id",
        _replace(lambda r: r.snapshot.pools.free_cpu_block_ids, [100, -7]),
        "snapshot.pools.free_cpu_block_ids[1]",
    ),
    (
        "rotary_holding_gpu_blocks",
        _extend(lambda r: r.snapshot.requests[1].gpu_block_ids, [20]),
        "snapshot.requests[1].gpu_block_ids",
    ),
    (
        "waiting_holding_blocks",
        _extend(lambda r: r.snapshot.requests[2].cpu_block_ids, [130]),
        "snapshot.requests[2].cpu_block_ids",
    ),
]


@pytest.mark.parametrize(
    ("mutation", "field"),
    [pytest.param(m, f, id=name) for name, m, f in BLOCK_CASES],
)
def test_block_level_invalid_argument(channel, stub, example_request, mutation, field):
    request = block_level_request()
    mutation(request)
    assert_invalid(channel, stub, request, field)
    assert_serving(channel, stub, example_request)


def test_shared_block_names_the_other_owner(channel, stub):
    request = block_level_request()
    request.snapshot.pools.free_gpu_block_ids.append(11)
    details = assert_invalid(channel, stub, request, "snapshot.requests[0].gpu_block_ids[1]")
    assert "snapshot.pools.free_gpu_block_ids" in details


# --- malformed bytes, limits ----------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"\xff\xff\xff\xff", id="truncated_varint"),
        pytest.param(b"\x0a\x10\x01", id="length_past_end"),
        pytest.param(b"\x07", id="invalid_wire_type"),
    ],
)
def test_garbage_bytes_are_invalid_argument(channel, stub, example_request, data):
    with pytest.raises(grpc.RpcError) as err:
        stub(channel, PLAN, raw=True)(data, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("request: ")
    assert "planner.v1.PlanRotationRequest" in err.value.details()
    assert_serving(channel, stub, example_request)


def test_more_requests_than_the_configured_max(start_server, stub, example_request):
    server = start_server(ServiceLimits(max_requests_per_snapshot=2))
    with grpc.insecure_channel(server.address) as ch:
        details = assert_invalid(ch, stub, example_request, "snapshot.requests")
        assert "3" in details
        assert "2" in details
        # At the limit it is answered: a alone fits (31 of 40 free blocks).
        del example_request.snapshot.requests[2]
        plan = stub(ch, PLAN)(example_request, timeout=10).plan
        assert plan.fcfs_fallback
        assert [d.id for d in plan.prioritized] == ["a"]


def test_message_larger_than_max_message_bytes(start_server, stub, example_request):
    server = start_server(ServiceLimits(max_message_bytes=4096))
    big = Request()
    big.CopyFrom(example_request)
    for i in range(400):
        big.snapshot.requests.add(
            id=f"w{i:04d}", state=common_pb2.WAITING, arrival_s=1.0, prompt_blocks=1
        )
    assert big.ByteSize() > 4096
    with grpc.insecure_channel(server.address) as ch:
        with pytest.raises(grpc.RpcError) as err:
            stub(ch, PLAN)(big, timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert_serving(ch, stub, example_request)


# --- columnar snapshots (RequestColumns) ------------------------------------------


def _col(name: str, index: int, value: object) -> Mutation:
    def mutate(r: Request) -> None:
        getattr(r.snapshot.columns, name)[index] = value

    return mutate


def _col_replace(name: str, values: list) -> Mutation:
    def mutate(r: Request) -> None:
        column = getattr(r.snapshot.columns, name)
        del column[:]
        column.extend(values)

    return mutate


# Columns: row 0 "a" WAITING, 1 "b" RUNNING, 2 "c" ROTARY.
COLUMN_CASES: list[tuple[str, Mutation, str]] = [
    ("duplicate_id", _col("id", 2, "a"), "snapshot.columns.id[2]"),
    ("empty_id", _col("id", 1, ""), "snapshot.columns.id[1]"),
    ("state_unspecified", _col("state", 1, 0), "snapshot.columns.state[1]"),
    ("state_unknown_99", _col("state", 1, 99), "snapshot.columns.state[1]"),
    ("negative_gpu", _col("gpu_blocks", 1, -1), "snapshot.columns.gpu_blocks[1]"),
    ("negative_prompt", _col("prompt_blocks", 0, -3), "snapshot.columns.prompt_blocks[0]"),
    ("arrival_inf", _col("arrival_s", 0, math.inf), "snapshot.columns.arrival_s[0]"),
    ("waiting_arrival_nan", _col("arrival_s", 0, math.nan), "snapshot.columns.arrival_s[0]"),
    ("running_start_nan", _col("run_start_s", 1, math.nan), "snapshot.columns.run_start_s[1]"),
    ("last_token_after_now", _col("last_token_s", 2, 12.0), "snapshot.columns.last_token_s[2]"),
    ("slo_negative", _col("slo_ttft_s", 0, -1.0), "snapshot.columns.slo_ttft_s[0]"),
    ("slo_nan", _col("slo_tbt_s", 2, math.nan), "snapshot.columns.slo_tbt_s[2]"),
    ("slo_huge", _col("slo_ttft_s", 0, 1e308), "snapshot.columns.slo_ttft_s[0]"),
    ("arrival_far_past", _col("arrival_s", 0, -1e300), "snapshot.columns.arrival_s[0]"),
    ("short_column", _col_replace("gpu_blocks", [0, 60]), "snapshot.columns.gpu_blocks"),
    ("long_column", _col_replace("state", [1, 2, 3, 1]), "snapshot.columns.state"),
    (
        "rows_and_columns",
        lambda r: r.snapshot.requests.add(
            id="z", state=common_pb2.WAITING, arrival_s=1.0, prompt_blocks=1
        ),
        "snapshot.columns",
    ),
    (
        "columns_with_pools",
        lambda r: (
            r.snapshot.ClearField("free_gpu_blocks"),
            r.snapshot.pools.free_gpu_block_ids.extend([0, 1]),
        ),
        "snapshot.columns",
    ),
]


@pytest.mark.parametrize(
    ("mutation", "field"),
    [pytest.param(m, f, id=name) for name, m, f in COLUMN_CASES],
)
def test_columns_invalid_argument(channel, stub, example_request, example_columns, mutation, field):
    mutation(example_columns)
    assert_invalid(channel, stub, example_columns, field)
    assert_serving(channel, stub, example_request)


def test_columns_duplicate_id_names_both_rows(channel, stub, example_columns):
    example_columns.snapshot.columns.id[2] = "a"
    details = assert_invalid(channel, stub, example_columns, "snapshot.columns.id[2]")
    assert "snapshot.columns.id[0]" in details


def test_columns_count_against_the_configured_max(start_server, stub, example_columns):
    server = start_server(ServiceLimits(max_requests_per_snapshot=2))
    with grpc.insecure_channel(server.address) as ch:
        assert_invalid(ch, stub, example_columns, "snapshot.columns.id")


def test_empty_columns_are_no_requests(channel, stub, example_columns):
    example_columns.snapshot.ClearField("columns")
    example_columns.snapshot.columns.SetInParent()
    plan = stub(channel, PLAN)(example_columns, timeout=10).plan
    assert plan.fcfs_fallback
    assert not plan.prioritized
    assert not plan.preempted
