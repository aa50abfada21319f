"""A synthetic snapshot as the PlanRotationRequest an engine adapter sends,
in either encoding of the contract: one TrackedRequest per request (rows,
the only form for block-level snapshots) or RequestColumns (one packed array
per field, what engines tracking many requests should send)."""

from __future__ import annotations

import math

from planner.bench.synthetic import SyntheticSnapshot
from planner.domain.requests import TrackedRequest
from planner.v1 import common_pb2, rotation_pb2

FORMS = ("rows", "columns")


def _tracked(r: TrackedRequest, block_level: bool) -> common_pb2.TrackedRequest:
    msg = common_pb2.TrackedRequest(
        id=r.id,
        state=common_pb2.RequestState.ValueType(int(r.state)),
        prompt_blocks=r.prompt_blocks,
        gpu_blocks=r.gpu_blocks,
        cpu_blocks=r.cpu_blocks,
        num_tokens=r.num_tokens or 0,
        synced_blocks=r.synced_blocks,
        slo_ttft_s=r.slo_ttft_s or 0.0,
        slo_tbt_s=r.slo_tbt_s or 0.0,
        prefill_tokens=r.prefill_tokens or 0,
        output_tokens=r.output_tokens or 0,
    )
    if not math.isnan(r.first_token_s):
        msg.first_token_s = r.first_token_s
    if not math.isnan(r.arrival_s):
        msg.arrival_s = r.arrival_s
    if not math.isnan(r.run_start_s):
        msg.run_start_s = r.run_start_s
    if not math.isnan(r.last_token_s):
        msg.last_token_s = r.last_token_s
    if block_level:
        msg.gpu_block_ids.extend(r.gpu_block_ids)
        msg.cpu_block_ids.extend(r.cpu_block_ids)
    return msg


def _columns(requests: tuple[TrackedRequest, ...]) -> common_pb2.RequestColumns:
    return common_pb2.RequestColumns(
        id=[r.id for r in requests],
        state=[common_pb2.RequestState.ValueType(int(r.state)) for r in requests],
        arrival_s=[r.arrival_s for r in requests],
        run_start_s=[r.run_start_s for r in requests],
        last_token_s=[r.last_token_s for r in requests],
        prompt_blocks=[r.prompt_blocks for r in requests],
        gpu_blocks=[r.gpu_blocks for r in requests],
        cpu_blocks=[r.cpu_blocks for r in requests],
        num_tokens=[r.num_tokens or 0 for r in requests],
        synced_blocks=[r.synced_blocks for r in requests],
        slo_ttft_s=[r.slo_ttft_s or 0.0 for r in requests],
        slo_tbt_s=[r.slo_tbt_s or 0.0 for r in requests],
        prefill_tokens=[r.prefill_tokens or 0 for r in requests],
        output_tokens=[r.output_tokens or 0 for r in requests],
        first_token_s=[r.first_token_s for r in requests],
    )


def plan_rotation_request(
    synthetic: SyntheticSnapshot, form: str = "rows"
) -> rotation_pb2.PlanRotationRequest:
    """The same decision problem as synthetic.snapshot() and .inputs()."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    if form == "columns" and synthetic.block_level:
        raise ValueError("block-level snapshots are sent as rows")
    mix = synthetic.mix
    snapshot = common_pb2.Snapshot(
        now_s=mix.now_s,
        free_gpu_blocks=synthetic.free_gpu_blocks,
        block_size_tokens=mix.block_size_tokens,
        free_cpu_blocks=synthetic.free_cpu_blocks,
        last_iteration_s=mix.last_iteration_s,
    )
    if form == "columns":
        snapshot.columns.CopyFrom(_columns(synthetic.requests))
    else:
        snapshot.requests.extend(_tracked(r, synthetic.block_level) for r in synthetic.requests)
    if synthetic.pools is not None:
        snapshot.pools.free_gpu_block_ids.extend(synthetic.pools.free_gpu_block_ids)
        snapshot.pools.free_cpu_block_ids.extend(synthetic.pools.free_cpu_block_ids)
    return rotation_pb2.PlanRotationRequest(
        snapshot=snapshot,
        params=rotation_pb2.RotationParams(transfer_budget_blocks=mix.transfer_budget_blocks),
        slo=common_pb2.Slo(ttft_s=mix.slo.ttft_s, tbt_s=mix.slo.tbt_s),
        profile=common_pb2.EngineProfile(
            model_name=mix.model_name, hardware_name=mix.hardware_name
        ),
    )
