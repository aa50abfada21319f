"""Per-layer fetch of layer-offload plans, with CPU tensors registered as the
KV caches: a layer the plan offloads is saved to CPU memory in
save_kv_layer (its GPU copy is then poisoned), fetched back bit for bit in
wait_for_layer_load before the next step's attention, follows the step's new
token, comes back resident when the plan changes, and is restored into its
GPU blocks before a swap-out; the worker's per-layer timings go back as
kv_connector_worker_meta."""

from __future__ import annotations

import copy

import pytest

from . import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

import torch
from planner.adapters.vllm.connector import PlannerSwapConnector, SwapMetadata
from planner.adapters.vllm.layer_fetch import LayerTimings
from planner.adapters.vllm.layer_ledger import ScheduledRequest
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.sampling_params import SamplingParams
from vllm.v1.request import Request

from .harness import BLOCK_SIZE, TOKEN_ID, kv_cache_config

pytestmark = pytest.mark.engines

LAYERS = ("layers.0", "layers.1", "layers.2")
POISON = -7.0
OFFLOAD = {"layer_compute_ms": 1.0, "link_blocks_per_s": 1000.0, "num_cpu_blocks": 8}
GPU_BLOCKS = (3, 5, 7)


@pytest.fixture
def pair(vllm_config):
    """(scheduler-side connector, worker-side connector, KV caches) with
    layer offload on: random bit patterns, NaN payloads included, in both
    vLLM layouts."""
    config = copy.deepcopy(vllm_config)
    config.additional_config = {"planner": {"layer_offload": OFFLOAD}}
    cache_config = kv_cache_config(LAYERS)
    scheduler_side = PlannerSwapConnector(config, KVConnectorRole.SCHEDULER, cache_config)
    worker = PlannerSwapConnector(config, KVConnectorRole.WORKER, cache_config)
    gen = torch.Generator().manual_seed(1)
    kv = {}
    for i, name in enumerate(LAYERS):
        shape = (2, cache_config.num_blocks, BLOCK_SIZE, 1, 2)
        bits = torch.randint(-(2**31), 2**31 - 1, shape, generator=gen, dtype=torch.int64)
        layer = bits.to(torch.int32).view(torch.float32)
        kv[name] = layer.clone() if i % 2 == 0 else layer.movedim(1, 0).contiguous()
    worker.register_kv_caches(kv)
    return scheduler_side, worker, kv


def _blocks(worker, name, blocks) -> torch.Tensor:
    """The given blocks of one layer, block-major, as raw bits."""
    return worker.gpu_layers[name][list(blocks)].clone().view(torch.int32)


def _run_step(scheduler_side, worker, kv, scheduled, write=None):
    """Schedule one step and run its worker half layer by layer. write(name)
    plays the attention's KV write; evicted GPU copies are poisoned after
    each layer's save. Returns the metadata and what each layer held right
    after its fetch."""
    ledger = scheduler_side.layer_ledger
    for request in scheduled:
        ledger.schedule(request)
    meta = SwapMetadata(scheduler_side.ledger.take_step(), ledger.take_step())
    worker.handle_preemptions(meta)
    worker.bind_connector_metadata(meta)
    fetched = {}
    for index, name in enumerate(LAYERS):
        worker.wait_for_layer_load(name)
        fetched[name] = _blocks(worker, name, GPU_BLOCKS)
        if write is not None:
            write(name)
        worker.save_kv_layer(name, kv[name], None)
        for block in meta.layers.evicted.get(index, ()):
            worker.gpu_layers[name][block].fill_(POISON)
    worker.wait_for_save()
    timings = worker.build_connector_worker_meta()
    worker.clear_connector_metadata()
    return meta, fetched, timings


def test_offloaded_layer_round_trips_bit_exactly_through_cpu(pair):
    scheduler_side, worker, kv = pair
    ledger = scheduler_side.layer_ledger
    before = {name: _blocks(worker, name, GPU_BLOCKS) for name in LAYERS}
    # Request "a" has 39 tokens of KV in blocks 3, 5, 7 and decodes token 40;
    # the plan offloads layer 1.
    ledger.set_targets({"a": [1]})
    meta, _, timings = _run_step(
        scheduler_side, worker, kv, [ScheduledRequest("a", 39, 1, GPU_BLOCKS)]
    )
    assert dict(meta.layers.evicted) == {1: list(GPU_BLOCKS)}
    assert not meta.layers.fetch
    assert ledger.offloaded_layers("a") == {1}
    assert bool((worker.gpu_layers["layers.1"][list(GPU_BLOCKS)] == POISON).all())
    assert isinstance(timings, LayerTimings)
    assert timings.fetched_blocks == (0, 0, 0)

    # Next step: layer 1 is fetched back before its attention, bit for bit;
    # the attention writes token 41's KV (position 40: block 7, slot 8).
    new_kv = torch.tensor([[[1.5, -2.5]], [[3.5, -4.5]]])

    def write(name):
        gpu = worker.gpu_layers[name]
        gpu[7, :, 40 % BLOCK_SIZE] = new_kv

    meta, fetched, timings = _run_step(
        scheduler_side, worker, kv, [ScheduledRequest("a", 40, 1, GPU_BLOCKS)], write
    )
    for name in LAYERS:
        assert torch.equal(fetched[name], before[name]), name
    assert timings.fetched_blocks == (0, 3, 0)
    # Only the block the step wrote goes back.
    assert meta.layers.save[1].src == [7]

    # The plan now keeps every layer resident: the last fetch brings the
    # new token back too, and the CPU blocks are free again.
    ledger.set_targets({})
    _, fetched, timings = _run_step(
        scheduler_side, worker, kv, [ScheduledRequest("a", 41, 1, GPU_BLOCKS)]
    )
    want = before["layers.1"].clone()
    want[2, :, 40 % BLOCK_SIZE] = new_kv.view(torch.int32)
    assert torch.equal(fetched["layers.1"], want)
    assert timings.fetched_blocks == (0, 3, 0)
    assert ledger.offloaded_layers("a") == frozenset()
    ledger.take_step()
    assert ledger.free_cpu_blocks == ledger.num_cpu_blocks


def test_preempted_request_gets_its_offloaded_layers_back_before_swap_out(pair):
    scheduler_side, worker, kv = pair
    ledger = scheduler_side.layer_ledger
    before = {name: _blocks(worker, name, GPU_BLOCKS) for name in LAYERS}
    ledger.set_targets({"a": [0, 2]})
    _run_step(scheduler_side, worker, kv, [ScheduledRequest("a", 39, 1, GPU_BLOCKS)])
    assert bool((worker.gpu_layers["layers.0"][list(GPU_BLOCKS)] == POISON).all())
    # Preempted to be swapped: the swap-out (same step) reads every layer
    # from the GPU blocks, so the offloaded ones are restored first.
    assert scheduler_side.preempt(_request("a", 40), list(GPU_BLOCKS), swap=True)
    meta = SwapMetadata(scheduler_side.ledger.take_step(), ledger.take_step())
    worker.handle_preemptions(meta)
    swapped = scheduler_side.ledger.swapped("a")
    assert swapped is not None
    for name in LAYERS:
        assert torch.equal(_blocks(worker, name, GPU_BLOCKS), before[name]), name
        cpu = worker.cpu_layers[name][list(swapped.cpu_block_ids)].view(torch.int32)
        assert torch.equal(cpu, before[name]), name
    ledger.take_step()
    assert ledger.free_cpu_blocks == ledger.num_cpu_blocks


def test_a_full_cpu_pool_keeps_the_request_resident(pair):
    scheduler_side, _, _ = pair
    ledger = scheduler_side.layer_ledger
    # 8 CPU blocks: "a" (3 blocks) and "b" (3) fit, "c" (3) does not.
    ledger.set_targets({"a": [1], "b": [1], "c": [1]})
    for rid, blocks in (("a", (0, 1, 2)), ("b", (3, 4, 5)), ("c", (6, 7, 8))):
        ledger.schedule(ScheduledRequest(rid, 39, 1, blocks))
    assert ledger.refused == 1
    assert ledger.offloaded_layers("c") == frozenset()
    assert ledger.free_cpu_blocks == 2


def test_timings_of_tensor_parallel_workers_aggregate_to_the_slowest():
    a = LayerTimings((0.1, 0.4), (2, 2), (1.0, 0.5), 2.0)
    b = LayerTimings((0.3, 0.2), (2, 2), (0.8, 0.9), 2.5)
    assert a.aggregate(b) == LayerTimings((0.3, 0.4), (2, 2), (1.0, 0.9), 2.5)
    assert a.link_blocks_per_s == pytest.approx(4 / 0.5)
    assert LayerTimings((0.0,), (0,), (1.0,), 1.0).link_blocks_per_s is None


@pytest.mark.parametrize(
    ("setting", "value", "field"),
    [
        ("layer_compute_ms", 0, "layer_compute_ms"),
        ("link_blocks_per_s", "fast", "link_blocks_per_s"),
        ("num_cpu_blocks", 2.5, "num_cpu_blocks"),
        ("engine_id", "", "engine_id"),
        ("bogus", 1, "bogus"),
    ],
)
def test_bad_layer_offload_setting_names_the_field(vllm_config, setting, value, field):
    config = copy.deepcopy(vllm_config)
    config.additional_config = {"planner": {"layer_offload": {**OFFLOAD, setting: value}}}
    with pytest.raises(ValueError, match=rf"planner\.layer_offload\.{field}"):
        PlannerSwapConnector(config, KVConnectorRole.SCHEDULER, kv_cache_config(LAYERS))


def _request(request_id: str, num_computed_tokens: int) -> Request:
    request = Request(
        request_id=request_id,
        prompt_token_ids=[TOKEN_ID] * num_computed_tokens,
        sampling_params=SamplingParams(max_tokens=4),
        pooling_params=None,
    )
    request.num_computed_tokens = num_computed_tokens
    return request


def test_the_connector_asks_vllm_for_piecewise_cuda_graphs():
    # Its per-layer hooks must run between graph pieces.
    assert PlannerSwapConnector.requires_piecewise_for_cudagraph({})


def test_layers_are_numbered_in_model_order(vllm_config):
    config = copy.deepcopy(vllm_config)
    config.additional_config = {"planner": {"layer_offload": OFFLOAD}}
    names = tuple(f"model.layers.{i}.self_attn.attn" for i in (10, 2, 0, 1))
    connector = PlannerSwapConnector(config, KVConnectorRole.SCHEDULER, kv_cache_config(names))
    assert connector.layer_names == [f"model.layers.{i}.self_attn.attn" for i in (0, 1, 2, 10)]
