"""The worker half of PlannerSwapConnector: KV swapped out, overwritten on
the GPU side, then swapped into other blocks comes back bit for bit, in both
vLLM cache layouts; a bad connector config names its field."""

from __future__ import annotations

import copy

import pytest

from . import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

import torch
from planner.adapters.vllm.connector import PlannerSwapConnector, SwapMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

pytestmark = pytest.mark.engines


def test_swapped_kv_round_trips_bit_exactly(vllm_config, kv_cache_config):
    scheduler_side = PlannerSwapConnector(vllm_config, KVConnectorRole.SCHEDULER, kv_cache_config)
    worker = PlannerSwapConnector(vllm_config, KVConnectorRole.WORKER, kv_cache_config)
    gen = torch.Generator().manual_seed(0)
    shape = (2, kv_cache_config.num_blocks, vllm_config.cache_config.block_size, 1, 4)
    # Random bits: NaN payloads and signed zeros included.
    bits = torch.randint(-(2**31), 2**31 - 1, shape, generator=gen)
    kv = {
        "layer-first": bits.to(torch.int32).view(torch.float32).clone(),
        "block-first": bits.to(torch.int32).view(torch.float32).movedim(1, 0).contiguous(),
    }
    before = {name: t.clone() for name, t in kv.items()}
    worker.register_kv_caches(kv)
    ledger = scheduler_side.ledger
    # 40 tokens in GPU blocks 3, 5, 7 go out, the blocks are reused, and the
    # KV comes back into blocks 0, 1, 2 (the last token is recomputed).
    assert ledger.swap_out("a", [3, 5, 7], 40)
    worker.handle_preemptions(SwapMetadata(ledger.take_step()))
    for t in kv.values():
        t.fill_(-1.0)
    loadable = ledger.loadable_tokens("a", total_tokens=41, local_tokens=0)
    assert loadable == 40
    ledger.swap_in("a", [0, 1, 2], 0, loadable)
    worker.bind_connector_metadata(SwapMetadata(ledger.take_step()))
    worker.start_load_kv(None)
    for name, cache in kv.items():
        got = cache if name == "block-first" else cache.movedim(1, 0)
        want = before[name] if name == "block-first" else before[name].movedim(1, 0)
        assert torch.equal(got[:3].view(torch.int32), want[[3, 5, 7]].view(torch.int32)), name
        assert bool((got[3:] == -1.0).all()), name
    assert ledger.free_cpu_blocks == ledger.num_cpu_blocks


@pytest.mark.parametrize("value", [None, 0, -3, "64", True])
def test_bad_num_cpu_blocks_names_the_field(vllm_config, kv_cache_config, value):
    config = copy.deepcopy(vllm_config)
    extra = dict(config.kv_transfer_config.kv_connector_extra_config)
    if value is None:
        extra.pop("num_cpu_blocks")
    else:
        extra["num_cpu_blocks"] = value
    config.kv_transfer_config.kv_connector_extra_config = extra
    with pytest.raises(ValueError, match=r"kv_connector_extra_config\.num_cpu_blocks"):
        PlannerSwapConnector(config, KVConnectorRole.SCHEDULER, kv_cache_config)
