"""Swap through SGLang's host KV pool: bit-exact round trips on CPU tensors
for both host layouts the planner's kernels address, with the device and
host buffers shaped as SGLang 0.5.23 allocates them
(mem_cache/memory_pool.py MHATokenToKVPool, mem_cache/pool_host/mha.py
MHATokenToKVPoolHost.init_kv_buffer)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from planner.adapters.sglang.host_swap import HostSwap, host_layer_view

LAYERS, HEADS, HEAD_DIM = 3, 2, 8
DEVICE_TOKENS, HOST_TOKENS, PAGE = 64, 32, 4


@dataclass
class DevicePool:
    k_buffer: list[torch.Tensor]
    v_buffer: list[torch.Tensor]


@dataclass
class HostPool:
    """HostKVCache.alloc/free: page-multiple allocations from free slots."""

    kv_buffer: torch.Tensor
    layout: str
    free_slots: list[int] = field(default_factory=lambda: list(range(HOST_TOKENS)))

    def alloc(self, need_size: int) -> torch.Tensor | None:
        assert need_size % PAGE == 0
        if need_size > len(self.free_slots):
            return None
        taken, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        return torch.tensor(taken, dtype=torch.int64)

    def free(self, indices: torch.Tensor) -> int:
        self.free_slots.extend(indices.tolist())
        return len(indices)


def device_pool(dtype: torch.dtype) -> DevicePool:
    gen = torch.Generator().manual_seed(7)

    def layer() -> torch.Tensor:
        return torch.randn(DEVICE_TOKENS, HEADS, HEAD_DIM, generator=gen).to(dtype)

    return DevicePool([layer() for _ in range(LAYERS)], [layer() for _ in range(LAYERS)])


def host_pool(layout: str, dtype: torch.dtype) -> HostPool:
    dims = {
        "layer_first": (2, LAYERS, HOST_TOKENS, HEADS, HEAD_DIM),
        "page_first": (2, HOST_TOKENS, LAYERS, HEADS, HEAD_DIM),
    }[layout]
    return HostPool(torch.zeros(dims, dtype=dtype), layout)


def bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swap_out_and_in_round_trips_bit_exactly(layout: str, dtype: torch.dtype) -> None:
    device = device_pool(dtype)
    host = host_pool(layout, dtype)
    swap = HostSwap(device, host)
    assert swap.uses_planner_kernels
    slots = torch.tensor([5, 6, 7, 8, 40, 41, 42, 43])
    saved_k = [k[slots].clone() for k in device.k_buffer]
    saved_v = [v[slots].clone() for v in device.v_buffer]
    host_slots = swap.swap_out(slots)
    assert host_slots is not None and len(host_slots) == len(slots)
    for layer in range(LAYERS):
        assert torch.equal(host_layer_view(host, 0, layer)[host_slots], saved_k[layer])
        assert torch.equal(host_layer_view(host, 1, layer)[host_slots], saved_v[layer])
        device.k_buffer[layer].zero_()
        device.v_buffer[layer].zero_()
    back = torch.tensor([60, 61, 62, 63, 0, 1, 2, 3])
    swap.swap_in(host_slots, back)
    for layer in range(LAYERS):
        assert bits(device.k_buffer[layer][back]) == bits(saved_k[layer])
        assert bits(device.v_buffer[layer][back]) == bits(saved_v[layer])
    assert sorted(host.free_slots) == list(range(HOST_TOKENS))


def test_full_host_pool_leaves_the_request_to_recompute() -> None:
    device = device_pool(torch.float32)
    host = host_pool("layer_first", torch.float32)
    host.free_slots = host.free_slots[:4]
    before = host.kv_buffer.clone()
    assert HostSwap(device, host).swap_out(torch.arange(8)) is None
    assert torch.equal(host.kv_buffer, before)


def test_swap_in_needs_one_device_slot_per_host_slot() -> None:
    swap = HostSwap(device_pool(torch.float32), host_pool("page_first", torch.float32))
    host_slots = swap.swap_out(torch.arange(4))
    assert host_slots is not None
    with pytest.raises(ValueError, match="device_indices has 2 slots for 4 host slots"):
        swap.swap_in(host_slots, torch.arange(2))


def test_other_layouts_have_no_token_view() -> None:
    host = HostPool(torch.zeros(1), "page_head")
    assert not HostSwap(device_pool(torch.float32), host).uses_planner_kernels
    with pytest.raises(ValueError, match="'page_head'"):
        host_layer_view(host, 0, 0)
